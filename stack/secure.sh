# The secure stack (CDC_STACK_SECURE=1), sourced by stack/stack.sh: a CA of the stack's own, made once with
# openssl; PostgreSQL with TLS (hostssl lines only, replication too) and scram-sha-256; Kafka with a SASL_SSL
# listener (SCRAM-SHA-512 users made at format time), TLS with client certificates between the broker and
# its controller, and StandardAuthorizer ACLs; the registry on HTTPS. Everything it makes lives under
# .stack/secure/ (mode 700); the clusters, logs and pid files have a "-secure" suffix and ports of their own,
# so that the plain and the secure stacks can run side by side.
#
# Users:
#   PostgreSQL  postgres (the cluster's superuser; password in .stack/pg-password, as in the plain stack)
#   Kafka       admin    super user: the tests' own clients and the stack's tools
#               cdc      what `cdc run` needs, on the names the tests use (grant_kafka_acls)
#               consumer what the idempotent consumer helper needs, likewise
# The server certificate names 127.0.0.1 and localhost; its DN, CN=outbox-cdc-broker, is the broker's
# principal on the listeners where it talks to itself and to its controller (mutual TLS).

SECURE_DIR=$STACK_DIR/secure
CA_FILE=$SECURE_DIR/ca.pem
BROKER_PRINCIPAL="User:CN=outbox-cdc-broker"
# The names the stack's `cdc` user holds rights on: the test suite's topics, dead-letter topics, checkpoint
# topics and transactional ids all start so (tests/plugins). An operator grants the names of a deployment
# (docs/operations.md, "Secure deployment").
CDC_TOPIC_PREFIXES=(cdc_ dlq_ ckpt_ outbox.)
CDC_TRANSACTIONAL_PREFIX=outbox-cdc.
CONSUMER_GROUP_PREFIXES=(group_ consumer_)

# ensure_tls: the CA and the server's certificate and key, made once. The key is PKCS#8 and unencrypted
# (Kafka's PEM keystore and PostgreSQL both read it so); .stack/secure is readable by its owner only.
ensure_tls() {
    command -v openssl >/dev/null 2>&1 || apt_install openssl
    [ -f "$SECURE_DIR/server-keystore.pem" ] && return 0
    say "making the secure stack's CA and server certificate (openssl) in $SECURE_DIR"
    mkdir -p "$SECURE_DIR"
    chmod 700 "$SECURE_DIR"
    local log=$STACK_DIR/logs/openssl.log
    (
        umask 077
        cd "$SECURE_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.pem \
            -subj "/CN=outbox-cdc local stack CA" -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" &&
            openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
                -subj "/CN=outbox-cdc-broker" &&
            printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "basicConstraints=CA:FALSE" \
                "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth,clientAuth" >server.ext &&
            openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
                -extfile server.ext -out server.pem &&
            cat server.key server.pem >server-keystore.pem
    ) >"$log" 2>&1 || fail "openssl could not make the stack's certificates" "$log"
    # Clients read the CA, the server as 'postgres' reads its own copies (install_pg_tls).
    chmod 644 "$CA_FILE"
}

# secure_password NAME: a random password kept in .stack/secure/NAME.password.
secure_password() {
    local file=$SECURE_DIR/$1.password
    if [ ! -f "$file" ]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '+/=' >"$file")
    fi
    cat "$file"
}

# install_pg_tls DATA_DIR: the server's certificate, key and the CA inside the data directory, owned by the
# server's user: it may not be allowed into this checkout (a clone under /root).
install_pg_tls() {
    cp "$SECURE_DIR/server.pem" "$SECURE_DIR/server.key" "$CA_FILE" "$1/"
    chmod 600 "$1/server.key"
    if is_root; then chown postgres: "$1/server.pem" "$1/server.key" "$1/ca.pem"; fi
}

pg_secure_conf() {
    cat <<EOF
ssl = on
ssl_cert_file = 'server.pem'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.pem'
ssl_min_protocol_version = 'TLSv1.2'
password_encryption = 'scram-sha-256'
EOF
}

pg_secure_hba() {
    cat <<EOF
# TCP only with TLS and a SCRAM password, replication too; the Unix socket under .stack/run is for the stack
# script only.
local   all             all                                     trust
local   replication     all                                     trust
hostssl all             all             127.0.0.1/32            scram-sha-256
hostssl replication     all             127.0.0.1/32            scram-sha-256
EOF
}

# The libpq parameters that verify the server: appended to the stack's DSNs.
pg_tls_params() { printf 'sslmode=verify-full&sslrootcert=%s' "$CA_FILE"; }

# kafka_secure_properties INTERNAL_PORT: what secure mode adds to server.properties (later keys win).
kafka_secure_properties() {
    local internal=$1
    cat <<EOF
# --- secure stack (stack/secure.sh) ---
listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,INTERNAL://127.0.0.1:$internal
advertised.listeners=SASL_SSL://127.0.0.1:$KAFKA_ADVERTISED_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,INTERNAL://127.0.0.1:$internal
listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL,INTERNAL:SSL
inter.broker.listener.name=INTERNAL
ssl.keystore.type=PEM
ssl.keystore.location=$SECURE_DIR/server-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$CA_FILE
ssl.client.auth=required
listener.name.sasl_ssl.ssl.client.auth=none
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;$BROKER_PRINCIPAL
allow.everyone.if.no.acl.found=false
EOF
}

# The format tool's arguments that make the SCRAM users.
kafka_scram_args() {
    local user
    for user in admin cdc consumer; do
        printf '%s\n' --add-scram "SCRAM-SHA-512=[name=$user,password=$(secure_password "kafka-$user")]"
    done
}

# The client properties of the stack's admin user, for the Kafka tools.
kafka_admin_client_properties() {
    local file=$SECURE_DIR/admin-client.properties
    (
        umask 077
        cat >"$file" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(secure_password kafka-admin)";
ssl.truststore.type=PEM
ssl.truststore.location=$CA_FILE
EOF
    )
    echo "$file"
}

# acl ARGS...: org.apache.kafka.tools.AclCommand as the admin user.
acl() {
    "${KAFKA_JAVA[@]}" org.apache.kafka.tools.AclCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
        --command-config "$(kafka_admin_client_properties)" "$@" >>"$STACK_DIR/logs/kafka-acls.log" 2>&1 ||
        fail "kafka-acls $* failed" "$STACK_DIR/logs/kafka-acls.log"
}

# The ACLs of the stack's users, granted once (they live in the cluster's metadata). The same commands, for
# the names of a deployment, are in docs/operations.md ("Secure deployment").
grant_kafka_acls() {
    # The marker names the grants' version: a stack made before a grant was added gets it at its next up.
    [ -f "$KAFKA_DATA/.acls-granted-4" ] && return 0
    say "granting the secure stack's Kafka ACLs (users cdc and consumer)"
    local prefix group
    for prefix in "${CDC_TOPIC_PREFIXES[@]}"; do
        acl --add --allow-principal User:cdc --operation Write --operation Describe --operation Create \
            --operation DescribeConfigs --operation Read --topic "$prefix" --resource-pattern-type prefixed
        acl --add --allow-principal User:consumer --operation Read --operation Describe --operation Write \
            --topic "$prefix" --resource-pattern-type prefixed
    done
    acl --add --allow-principal User:cdc --operation IdempotentWrite --cluster
    acl --add --allow-principal User:cdc --operation Write --operation Describe \
        --transactional-id "$CDC_TRANSACTIONAL_PREFIX" --resource-pattern-type prefixed
    # The exactly-once checkpoint reader is a consumer: librdkafka finds its group's coordinator.
    acl --add --allow-principal User:cdc --operation Describe \
        --group outbox-cdc-checkpoint- --resource-pattern-type prefixed
    # `cdc dlq` keeps its place in a dead-letter topic as a group's committed offsets (cdc-dlq-<topic>).
    acl --add --allow-principal User:cdc --operation Read --operation Describe \
        --group cdc-dlq- --resource-pattern-type prefixed
    # `cdc audit` reads as a group of its own that never joins (cdc-audit-<slot>): Describe, like the
    # checkpoint reader's.
    acl --add --allow-principal User:cdc --operation Describe --group cdc-audit- --resource-pattern-type prefixed
    for group in "${CONSUMER_GROUP_PREFIXES[@]}"; do
        acl --add --allow-principal User:consumer --operation Read --operation Describe \
            --group "$group" --resource-pattern-type prefixed
    done
    touch "$KAFKA_DATA/.acls-granted-4"
}

# The registry on HTTPS only, with the stack's certificate.
registry_tls_args() {
    printf '%s\n' -Dquarkus.http.ssl-port="$REGISTRY_PORT" -Dquarkus.http.insecure-requests=disabled \
        -Dquarkus.http.ssl.certificate.files="$SECURE_DIR/server.pem" \
        -Dquarkus.http.ssl.certificate.key-files="$SECURE_DIR/server.key"
}

# The secure part of .stack/env.
secure_env() {
    cat <<EOF
# The secure stack (CDC_STACK_SECURE=1): TLS everywhere, SCRAM users, ACLs (stack/secure.sh).
export CDC_STACK_SECURE='1'
export CDC_STACK_CA_FILE='$CA_FILE'
export CDC_KAFKA_SECURITY_PROTOCOL='SASL_SSL'
export CDC_KAFKA_SASL_MECHANISM='SCRAM-SHA-512'
export CDC_KAFKA_SASL_USERNAME='cdc'
export CDC_KAFKA_SASL_PASSWORD='$(secure_password kafka-cdc)'
export CDC_KAFKA_SSL_CA_LOCATION='$CA_FILE'
export CDC_SCHEMA_REGISTRY_CA_FILE='$CA_FILE'
export CDC_STACK_KAFKA_ADMIN_USERNAME='admin'
export CDC_STACK_KAFKA_ADMIN_PASSWORD='$(secure_password kafka-admin)'
export CDC_STACK_KAFKA_CONSUMER_USERNAME='consumer'
export CDC_STACK_KAFKA_CONSUMER_PASSWORD='$(secure_password kafka-consumer)'
EOF
}
