{{/* The chart's name, and the release's full name (at most 30 characters: a pipeline's name follows it). */}}
{{- define "outbox-cdc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 30 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-cdc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-cdc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of a pipeline's objects: <fullname>-<pipeline>. Takes (dict "root" $ "p" $pipeline). */}}
{{- define "outbox-cdc.pipelineName" -}}
{{- printf "%s-%s" (include "outbox-cdc.fullname" .root) .p.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-cdc.labels" -}}
helm.sh/chart: {{ include "outbox-cdc.chart" . }}
app.kubernetes.io/name: {{ include "outbox-cdc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* A pipeline's selector labels. Takes (dict "root" $ "p" $pipeline). */}}
{{- define "outbox-cdc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-cdc.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: pipeline
outbox-cdc/pipeline: {{ .p.name }}
{{- end -}}

{{- define "outbox-cdc.pipelineLabels" -}}
{{ include "outbox-cdc.labels" .root }}
app.kubernetes.io/component: pipeline
outbox-cdc/pipeline: {{ .p.name }}
{{- end -}}

{{- define "outbox-cdc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outbox-cdc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "outbox-cdc.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
A pipeline with the release-wide values merged under it: its own kafka, schemaRegistry, settings, resources,
probes and podAnnotations win key by key. Takes (dict "root" $ "p" $pipeline); returns YAML (fromYaml it).
*/}}
{{- define "outbox-cdc.merged" -}}
{{- $v := .root.Values -}}
{{- $shared := dict "kafka" (deepCopy $v.kafka) "schemaRegistry" (deepCopy $v.schemaRegistry) "settings" (deepCopy $v.settings) "resources" (deepCopy $v.resources) "probes" (deepCopy $v.probes) "podAnnotations" (deepCopy $v.podAnnotations) -}}
{{- $p := mergeOverwrite $shared (deepCopy .p) -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
A setting's value as the text of a CDC_* variable: whole numbers without a decimal point (YAML numbers reach a
template as floats, and 200000 would print as 2e+05), lists comma-separated, booleans as true/false.
*/}}
{{- define "outbox-cdc.scalar" -}}
{{- $v := . -}}
{{- if kindIs "slice" $v -}}
{{- join "," $v -}}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) -}}
{{- printf "%d" (int64 $v) -}}
{{- else -}}
{{- toString $v -}}
{{- end -}}
{{- end -}}

{{/* Where a mounted secret's file lands. */}}
{{- define "outbox-cdc.paths" -}}
databasePassword: /var/run/secrets/outbox-cdc/database
databaseCa: /etc/outbox-cdc/database-ca
kafkaPassword: /var/run/secrets/outbox-cdc/kafka-sasl
kafkaCa: /etc/outbox-cdc/kafka-ca
registryCa: /etc/outbox-cdc/registry-ca
{{- end -}}

{{/* terminationGracePeriodSeconds of a merged pipeline: its shutdown_timeout (30 by default) + the margin. */}}
{{- define "outbox-cdc.grace" -}}
{{- $timeout := 30.0 -}}
{{- if hasKey .p.settings "shutdown_timeout" -}}{{- $timeout = float64 (get .p.settings "shutdown_timeout") -}}{{- end -}}
{{- add (ceil $timeout | int64) .root.Values.terminationGraceMarginSeconds -}}
{{- end -}}

{{/*
The non-secret settings of a merged pipeline as CDC_* variables (a YAML map): what its ConfigMap holds and its
setup Job's environment. Takes (dict "root" $ "p" $merged "database" $databaseRefs).
*/}}
{{- define "outbox-cdc.env" -}}
{{- $p := .p -}}
{{- $paths := include "outbox-cdc.paths" . | fromYaml -}}
{{- $env := dict -}}
{{- range $key, $value := $p.settings -}}
{{- $_ := set $env (printf "CDC_%s" (upper $key)) (include "outbox-cdc.scalar" $value) -}}
{{- end -}}
{{- $_ := set $env "CDC_SLOT" (default "cdc_outbox" $p.slot) -}}
{{- $_ := set $env "CDC_PUBLICATION" (default "cdc_outbox" $p.publication) -}}
{{- $_ := set $env "CDC_TABLE" (default "public.outbox" $p.table) -}}
{{- $topics := default dict $p.topics -}}
{{- if $topics.template -}}{{- $_ := set $env "CDC_TOPIC_TEMPLATE" $topics.template -}}{{- end -}}
{{- if $topics.dlq -}}{{- $_ := set $env "CDC_DLQ_TOPIC" $topics.dlq -}}{{- end -}}
{{- $_ := set $env "CDC_DELIVERY" (default "at-least-once" $p.delivery) -}}
{{- $_ := set $env "CDC_ON_SLOT_ACTIVE" (ternary "wait" "refuse" (default false $p.standby)) -}}
{{- $_ := set $env "CDC_METRICS_PORT" (include "outbox-cdc.scalar" .root.Values.metrics.port) -}}
{{- $_ := set $env "CDC_METRICS_HOST" "0.0.0.0" -}}
{{- $db := .database -}}
{{- if and $db.passwordSecret $db.passwordSecret.name -}}
{{- $_ := set $env "CDC_DATABASE_PASSWORD_FILE" (printf "%s/%s" $paths.databasePassword $db.passwordSecret.key) -}}
{{- end -}}
{{- $k := $p.kafka -}}
{{- $_ := set $env "CDC_KAFKA_BOOTSTRAP_SERVERS" (required (printf "pipeline %s: kafka.bootstrapServers is required" $p.name) $k.bootstrapServers) -}}
{{- range $key, $value := $k.config -}}
{{- $_ := set $env (printf "CDC_KAFKA_%s" (upper (replace "." "_" $key))) (include "outbox-cdc.scalar" $value) -}}
{{- end -}}
{{- if $k.securityProtocol -}}{{- $_ := set $env "CDC_KAFKA_SECURITY_PROTOCOL" $k.securityProtocol -}}{{- end -}}
{{- if $k.sasl.mechanism -}}{{- $_ := set $env "CDC_KAFKA_SASL_MECHANISM" $k.sasl.mechanism -}}{{- end -}}
{{- if $k.sasl.username -}}{{- $_ := set $env "CDC_KAFKA_SASL_USERNAME" $k.sasl.username -}}{{- end -}}
{{- if $k.sasl.passwordSecret.name -}}
{{- $_ := set $env "CDC_KAFKA_SASL_PASSWORD_FILE" (printf "%s/%s" $paths.kafkaPassword $k.sasl.passwordSecret.key) -}}
{{- end -}}
{{- if $k.tls.caSecret.name -}}
{{- $_ := set $env "CDC_KAFKA_SSL_CA_LOCATION" (printf "%s/%s" $paths.kafkaCa $k.tls.caSecret.key) -}}
{{- end -}}
{{- $r := $p.schemaRegistry -}}
{{- if $r.url -}}{{- $_ := set $env "CDC_SCHEMA_REGISTRY_URL" $r.url -}}{{- end -}}
{{- if $r.caSecret.name -}}
{{- $_ := set $env "CDC_SCHEMA_REGISTRY_CA_FILE" (printf "%s/%s" $paths.registryCa $r.caSecret.key) -}}
{{- end -}}
{{- if and $db.caSecret $db.caSecret.name -}}
{{- $_ := set $env "PGSSLROOTCERT" (printf "%s/%s" $paths.databaseCa $db.caSecret.key) -}}
{{- end -}}
{{- if $db.sslMode -}}{{- $_ := set $env "PGSSLMODE" $db.sslMode -}}{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/*
The variables taken from Secrets (by reference: secretKeyRef), for a merged pipeline and its database refs
(the runtime's, or the setup Job's admin). A YAML list of EnvVar.
*/}}
{{- define "outbox-cdc.secretEnv" -}}
- name: CDC_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "pipeline %s: the database URL's Secret (database.urlSecret.name) is required" .p.name) .database.urlSecret.name }}
      key: {{ default "url" .database.urlSecret.key }}
{{- if .p.schemaRegistry.urlSecret.name }}
- name: CDC_SCHEMA_REGISTRY_URL
  valueFrom:
    secretKeyRef:
      name: {{ .p.schemaRegistry.urlSecret.name }}
      key: {{ .p.schemaRegistry.urlSecret.key }}
{{- end }}
{{- end -}}

{{/* The Secret volumes of a merged pipeline and its database refs: a YAML list of Volume. */}}
{{- define "outbox-cdc.volumes" -}}
{{- $db := .database -}}
{{- $k := .p.kafka -}}
{{- $r := .p.schemaRegistry -}}
{{- if and $db.passwordSecret $db.passwordSecret.name }}
- name: database-password
  secret:
    secretName: {{ $db.passwordSecret.name }}
    defaultMode: 0440
    items: [{key: {{ $db.passwordSecret.key | quote }}, path: {{ $db.passwordSecret.key | quote }}}]
{{- end }}
{{- if and $db.caSecret $db.caSecret.name }}
- name: database-ca
  secret:
    secretName: {{ $db.caSecret.name }}
    defaultMode: 0444
    items: [{key: {{ $db.caSecret.key | quote }}, path: {{ $db.caSecret.key | quote }}}]
{{- end }}
{{- if $k.sasl.passwordSecret.name }}
- name: kafka-password
  secret:
    secretName: {{ $k.sasl.passwordSecret.name }}
    defaultMode: 0440
    items: [{key: {{ $k.sasl.passwordSecret.key | quote }}, path: {{ $k.sasl.passwordSecret.key | quote }}}]
{{- end }}
{{- if $k.tls.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ $k.tls.caSecret.name }}
    defaultMode: 0444
    items: [{key: {{ $k.tls.caSecret.key | quote }}, path: {{ $k.tls.caSecret.key | quote }}}]
{{- end }}
{{- if $r.caSecret.name }}
- name: registry-ca
  secret:
    secretName: {{ $r.caSecret.name }}
    defaultMode: 0444
    items: [{key: {{ $r.caSecret.key | quote }}, path: {{ $r.caSecret.key | quote }}}]
{{- end }}
{{- end -}}

{{/*
Where they are mounted: whole directories, never subPath, so that the kubelet replaces a rotated password in
place and the next connection reads the new one.
*/}}
{{- define "outbox-cdc.volumeMounts" -}}
{{- $paths := include "outbox-cdc.paths" . | fromYaml -}}
{{- $db := .database -}}
{{- $k := .p.kafka -}}
{{- $r := .p.schemaRegistry -}}
{{- if and $db.passwordSecret $db.passwordSecret.name }}
- {name: database-password, mountPath: {{ $paths.databasePassword }}, readOnly: true}
{{- end }}
{{- if and $db.caSecret $db.caSecret.name }}
- {name: database-ca, mountPath: {{ $paths.databaseCa }}, readOnly: true}
{{- end }}
{{- if $k.sasl.passwordSecret.name }}
- {name: kafka-password, mountPath: {{ $paths.kafkaPassword }}, readOnly: true}
{{- end }}
{{- if $k.tls.caSecret.name }}
- {name: kafka-ca, mountPath: {{ $paths.kafkaCa }}, readOnly: true}
{{- end }}
{{- if $r.caSecret.name }}
- {name: registry-ca, mountPath: {{ $paths.registryCa }}, readOnly: true}
{{- end }}
{{- end -}}
