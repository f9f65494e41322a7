"""The Helm chart, without a cluster: `helm lint`, `helm template` over the values files of
deploy/helm/outbox-cdc/ci/ (one pipeline, three, a standby, exactly-once, the secure stack's TLS and SASL,
monitoring), every object validated strictly against Kubernetes' own schemas for the oldest and the newest
supported minor version (kubernetes-validate ships them), and what a pod of it must be: Recreate, its probes
on the metrics port, no secret value anywhere, one Deployment per pipeline, a restricted securityContext,
wrong values refused by their name. tests/deploy/test_chart_pods.py then runs the rendered pods."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cdc.config import Settings
from tests.plugins.helm import CHART, CI_VALUES, Render

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
# Kubernetes supports its three newest minor versions; the chart is checked against the oldest and the
# newest of them.
KUBERNETES_VERSIONS = ("1.35.0", "1.37.0")
# Prometheus Operator's kinds: not in Kubernetes' schemas (checked by test_monitoring_objects_come_from_the_
# repositorys_one_copy instead).
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
ALERTS = ROOT / "deploy/prometheus/outbox-cdc-alerts.yml"
AUDIT_ALERTS = ROOT / "deploy/prometheus/outbox-cdc-audit.yml"
DASHBOARD = ROOT / "deploy/grafana/outbox-cdc-dashboard.json"


def ci(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def config_maps(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o["data"] for o in of_kind(objects, "ConfigMap") if "data" in o}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def settings_of(objects: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    (ref,) = container(deployment)["envFrom"]
    return config_maps(objects)[ref["configMapRef"]["name"]]


# -- lint, and the Kubernetes schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_passes_strictly(
    values: Path, helm_run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    done = helm_run("lint", "--strict", str(CHART), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_object_is_valid_for_kubernetes(values: Path, version: str, render: Render) -> None:
    objects = render(values)
    checked = 0
    invalid = []
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(map(str, exc.absolute_path))
            invalid.append(f"{obj['kind']} {obj['metadata']['name']} at {where}: {exc.message[:200]}")
        checked += 1
    assert not invalid, f"not valid for Kubernetes {version}: " + "; ".join(invalid)
    assert checked >= 4  # at least a ServiceAccount, a ConfigMap, a Service and a Deployment


def test_the_schemas_refuse_what_kubernetes_would() -> None:
    """The validation can fail: a misspelt field, and a wrong type."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {**deployment, "spec": {"replica": 1}}, KUBERNETES_VERSIONS[0], strict=True
        )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {**deployment, "spec": {"replicas": "1"}}, KUBERNETES_VERSIONS[1], strict=True
        )


# -- one Deployment per pipeline, Recreate, the standby ------------------------------------------------------


def test_one_deployment_per_pipeline_each_with_its_own_settings(render: Render) -> None:
    objects = render(ci("three-pipelines"))
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    assert set(deployments) == {"rel-outbox-cdc-orders", "rel-outbox-cdc-billing", "rel-outbox-cdc-shipping"}
    slots = {name: settings_of(objects, d)["CDC_SLOT"] for name, d in deployments.items()}
    assert slots == {
        "rel-outbox-cdc-orders": "orders_cdc",
        "rel-outbox-cdc-billing": "billing_cdc",
        "rel-outbox-cdc-shipping": "shipping_cdc",
    }
    billing = settings_of(objects, deployments["rel-outbox-cdc-billing"])
    # The pipeline's own settings over the shared ones; whole numbers stay whole (not 5e+04).
    assert billing["CDC_MAX_IN_FLIGHT"] == "50000"
    assert billing["CDC_TOPIC_REPLICATION_FACTOR"] == "3"
    assert billing["CDC_KAFKA_SOCKET_TIMEOUT_MS"] == "30000"
    assert billing["CDC_TABLE"] == "billing.outbox"
    assert (
        settings_of(objects, deployments["rel-outbox-cdc-shipping"])["CDC_AGGREGATE_TYPES"]
        == "shipment,parcel"
    )
    assert container(deployments["rel-outbox-cdc-billing"])["resources"]["limits"] == {"memory": "384Mi"}
    # Every selector picks only its own pipeline's pods.
    selectors = [tuple(sorted(d["spec"]["selector"]["matchLabels"].items())) for d in deployments.values()]
    assert len(set(selectors)) == 3


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_deployment_is_recreate_with_one_reader_or_a_standby(values: Path, render: Render) -> None:
    objects = render(values)
    for deployment in of_kind(objects, "Deployment"):
        spec = deployment["spec"]
        assert spec["strategy"] == {"type": "Recreate"}, "RollingUpdate would run two readers of one slot"
        on_slot_active = settings_of(objects, deployment)["CDC_ON_SLOT_ACTIVE"]
        assert (spec["replicas"], on_slot_active) in {(1, "refuse"), (2, "wait")}


def test_a_standby_is_a_second_replica_that_waits_for_the_slot(render: Render) -> None:
    objects = render(ci("standby"))
    (deployment,) = of_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert settings_of(objects, deployment)["CDC_ON_SLOT_ACTIVE"] == "wait"
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    (budget,) = of_kind(objects, "PodDisruptionBudget")
    # The waiting standby is never ready: without AlwaysAllow it would count against the budget.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_no_disruption_budget_by_default(render: Render) -> None:
    assert not of_kind(render(ci("one-pipeline")), "PodDisruptionBudget")


# -- probes, the grace period, the checksum ------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_probes_ask_the_metrics_port_the_pipeline_listens_on(values: Path, render: Render) -> None:
    objects = render(values)
    for deployment in of_kind(objects, "Deployment"):
        c = container(deployment)
        settings = settings_of(objects, deployment)
        (port,) = c["ports"]
        assert port["name"] == "metrics" and port["containerPort"] == int(settings["CDC_METRICS_PORT"])
        # Loopback is the pipeline's default: a kubelet could not probe it.
        assert settings["CDC_METRICS_HOST"] == "0.0.0.0"
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        # A probe's answer never takes longer than its period.
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert c[probe]["timeoutSeconds"] <= c[probe]["periodSeconds"]


def test_the_grace_period_is_shutdown_timeout_plus_a_margin(render: Render) -> None:
    objects = render(ci("three-pipelines"))
    grace = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for d in of_kind(objects, "Deployment")
    }
    default = Settings(database_url="x").shutdown_timeout
    assert grace == {
        "rel-outbox-cdc-orders": default + 15,
        "rel-outbox-cdc-billing": 60 + 15,  # its own shutdown_timeout
        "rel-outbox-cdc-shipping": default + 15,
    }


def test_a_change_of_settings_rolls_the_pods_and_nothing_else_does(render: Render) -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        (deployment,) = of_kind(render(ci("one-pipeline"), values=values), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    same = checksum(None)
    assert checksum({"podLabels": {"team": "payments"}}) == same
    assert checksum({"settings": {"max_in_flight": 10000}}) != same
    assert checksum({"kafka": {"config": {"linger.ms": 5}}}) != same


# -- security ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_pods_run_restricted_as_the_images_user(values: Path, render: Render) -> None:
    image_user = re.findall(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.M)[-1]
    objects = render(values)
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")]
    assert pods
    for pod in pods:
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert (str(sc["runAsUser"]), str(sc["runAsGroup"])) == image_user
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True
    for account in of_kind(objects, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False


SECRET_WORDS = re.compile(r"password|secret|token|credential", re.I)


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_no_secret_value_in_any_rendered_object(values: Path, render: Render) -> None:
    """Secrets come by reference only: no Secret object, no literal value of a secret-like variable, no
    credentials in a URL; a password reaches the pod as a mounted file."""
    objects = render(values)
    assert not of_kind(objects, "Secret")
    text = yaml.safe_dump_all(objects)
    assert not re.search(r"://[^/@\s]*:[^/@\s]*@", text), "credentials in a URL"
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "data" in obj and "outbox-cdc-dashboard.json" not in obj["data"]:
            for key, value in obj["data"].items():
                if SECRET_WORDS.search(key):
                    assert key.endswith("_FILE") and value.startswith("/var/run/secrets/"), (key, value)
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if pod is None:
            continue
        for c in pod["containers"]:
            for var in c.get("env", []):
                secret_like = SECRET_WORDS.search(var["name"]) or var["name"].endswith("_URL")
                if secret_like and not var["name"].endswith("_FILE"):
                    assert "valueFrom" in var and "secretKeyRef" in var["valueFrom"], var
        for volume in pod.get("volumes", []):
            assert "secret" in volume or "emptyDir" in volume or "configMap" in volume, volume


def test_the_defaults_hold_no_secret(helm_run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    shown = helm_run("show", "values", str(CHART))
    defaults = yaml.safe_load(shown.stdout)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if re.search(r"password|secret", key, re.I) and isinstance(value, str):
                    assert value == "", f"{path}.{key} has a default"
                walk(value, f"{path}.{key}")

    walk(defaults, "values")
    assert defaults["kafka"]["sasl"]["passwordSecret"]["name"] == ""
    assert defaults["pipelines"] == []


def test_passwords_are_mounted_files_for_rotation(render: Render) -> None:
    objects = render(ci("secure"))
    (deployment,) = of_kind(objects, "Deployment")
    settings = settings_of(objects, deployment)
    mounts = {m["mountPath"]: m for m in container(deployment)["volumeMounts"]}
    for key in ("CDC_DATABASE_PASSWORD_FILE", "CDC_KAFKA_SASL_PASSWORD_FILE"):
        directory = settings[key].rsplit("/", 1)[0]
        # A whole directory, never subPath: the kubelet updates a rotated Secret in place only then.
        assert directory in mounts and "subPath" not in mounts[directory]
    assert settings["CDC_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert settings["CDC_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert settings["CDC_KAFKA_SSL_CA_LOCATION"] == "/etc/outbox-cdc/kafka-ca/ca.crt"
    assert settings["PGSSLMODE"] == "verify-full"
    (policy,) = of_kind(objects, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_the_setup_hook_uses_its_own_admin_credentials(render: Render) -> None:
    objects = render(ci("exactly-once"))
    (job,) = of_kind(objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    c = container(job)
    assert c["args"] == ["setup", "--role", "cdc_pipeline"]
    url = {v["name"]: v for v in c["env"]}["CDC_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert url["name"] == "payments-db-admin"
    (deployment,) = of_kind(objects, "Deployment")
    runtime = {v["name"]: v for v in container(deployment)["env"]}["CDC_DATABASE_URL"]["valueFrom"][
        "secretKeyRef"
    ]
    assert runtime["name"] == "payments-db"
    # The hook runs before the release's ConfigMap exists: it carries the same settings itself.
    env = {v["name"]: v.get("value") for v in c["env"]}
    for key, value in settings_of(objects, deployment).items():
        assert env[key] == value, key
    assert env["CDC_DELIVERY"] == "exactly-once"
    # Its pods are not the pipeline's: the Service does not select them.
    (service,) = of_kind(objects, "Service")
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


# -- monitoring from the repository's one copy ---------------------------------------------------------------


def test_monitoring_objects_come_from_the_repositorys_one_copy(render: Render) -> None:
    objects = render(ci("monitoring"))
    (rule,) = of_kind(objects, "PrometheusRule")
    expected = (
        yaml.safe_load(ALERTS.read_text())["groups"] + yaml.safe_load(AUDIT_ALERTS.read_text())["groups"]
    )
    assert rule["spec"]["groups"] == expected
    assert "{{ $labels.instance }}" in json.dumps(rule)  # Prometheus' templates, not rendered by helm
    (dashboard,) = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert json.loads(dashboard["data"]["outbox-cdc-dashboard.json"]) == json.loads(DASHBOARD.read_text())
    (monitor,) = of_kind(objects, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    # The rules' CdcPipelineDown asks for job="outbox-cdc", whatever the release is called.
    assert {"action": "replace", "targetLabel": "job", "replacement": "outbox-cdc"} in endpoint["relabelings"]
    services = of_kind(objects, "Service")
    assert len(services) == 2
    for service in services:
        assert all(
            service["metadata"]["labels"][k] == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items()
        )


def test_the_chart_reads_the_files_of_deploy_and_keeps_no_copy() -> None:
    """files/prometheus and files/grafana are links (git mode 120000) to deploy/: one copy of each file."""
    listed = subprocess.run(
        ["git", "ls-files", "-s", "deploy"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    modes = {line.split("\t")[1]: line.split()[0] for line in listed}
    assert modes["deploy/helm/outbox-cdc/files/prometheus"] == "120000"
    assert modes["deploy/helm/outbox-cdc/files/grafana"] == "120000"
    for link in ("prometheus", "grafana"):
        assert (CHART / "files" / link).resolve() == (ROOT / "deploy" / link).resolve()
    contents: dict[bytes, list[str]] = {}
    for path in [p for p, mode in modes.items() if mode != "120000"]:
        contents.setdefault((ROOT / path).read_bytes(), []).append(path)
    for source in (ALERTS, AUDIT_ALERTS, DASHBOARD):
        assert contents[source.read_bytes()] == [str(source.relative_to(ROOT))]


# -- values refused by name ----------------------------------------------------------------------------------

ONE = {"kafka": {"bootstrapServers": "kafka:9092"}}


def pipeline(**fields: Any) -> dict[str, Any]:
    return {"name": "orders", "database": {"urlSecret": {"name": "orders-db", "key": "url"}}, **fields}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({**ONE, "pipelines": [pipeline(standby="yes")]}, "/pipelines/0/standby"),
        ({**ONE, "pipelines": [pipeline(delivery="exactly_once")]}, "/pipelines/0/delivery"),
        ({**ONE, "pipelines": [pipeline(slot="Orders-Slot")]}, "/pipelines/0/slot"),
        ({**ONE, "pipelines": [pipeline(name="Orders")]}, "/pipelines/0/name"),
        ({**ONE, "pipelines": [{"name": "orders"}]}, "database"),
        ({**ONE, "settings": {"max_in_flght": 5}}, "max_in_flght"),
        ({**ONE, "settings": {"shutdown_timeout": "soon"}}, "/settings/shutdown_timeout"),
        ({**ONE, "settings": {"slot": "x"}}, "'slot'"),  # the chart's own: pipelines[].slot
        ({**ONE, "strategy": {"type": "RollingUpdate"}}, "'strategy'"),
        ({**ONE, "kafka": {"config": {"sasl.password": "hunter2"}}}, "sasl.password"),
        ({**ONE, "schemaRegistry": {"url": "https://user:pw@registry:8081"}}, "/schemaRegistry/url"),
        ({**ONE, "securityContext": {"runAsNonRoot": False}}, "/securityContext/runAsNonRoot"),
        ({**ONE, "setup": {"enabled": True}}, "/setup/adminUrlSecret"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_wrong_values_are_refused_by_name(
    values: dict[str, Any], named: str, render_error: Callable[..., str]
) -> None:
    message = render_error(values=values)
    assert "values don't meet the specifications of the schema" in message
    assert named in message, message


def test_two_pipelines_of_one_name_are_refused(render_error: Callable[..., str]) -> None:
    message = render_error(values={**ONE, "pipelines": [pipeline(), pipeline(slot="other")]})
    assert 'the name "orders" is given twice' in message


def test_a_pipeline_without_kafka_is_refused_by_name(render_error: Callable[..., str]) -> None:
    assert "kafka.bootstrapServers is required" in render_error(values={"pipelines": [pipeline()]})
