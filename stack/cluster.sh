# The three-broker cluster (CDC_STACK_KAFKA_BROKERS=3), sourced by stack/stack.sh: brokers b1, b2 and b3 and
# a dedicated KRaft controller, ctl, all on loopback, each with its own data directory, log, pid file and
# properties (.stack/kafka/data-b1, .stack/logs/kafka-b1.log, .stack/kafka-b1.pid,
# .stack/kafka/server-b1.properties; with CDC_STACK_SECURE=1 the suffix is -secure-b1).
#
# Why a dedicated controller rather than three combined broker+controller nodes with a three-voter quorum:
# the cluster is there to take broker faults (kill -9 of a leader, controlled shutdowns, rolling restarts, two
# brokers down at once). With combined nodes, two nodes down is also a lost quorum: the metadata freezes, no
# follower leaves the ISR, and the leader that is left times out acks=all requests instead of answering
# NOT_ENOUGH_REPLICAS; that is a controller outage, another fault. With a controller of its own the quorum
# outlives any broker fault, so two brokers down gives ISR = 1 < min.insync.replicas = 2, which is what the
# fault suite means to test. The price is a fourth JVM (a small one: the controller gets 256 MB of heap) and
# a controller that is a single point of failure, which the stack never kills.
#
# Ports, from CDC_STACK_KAFKA_PORT (P) and CDC_STACK_KAFKA_CONTROLLER_PORT (C):
#   broker bN   clients on P + 10 (N - 1), its inter-broker listener on that + 5 (secure mode only)
#   ctl         C
# By default P = 29192 and C = 29193 (27192 and 27193 when secure), so that the cluster runs beside the
# single broker (29092) of the same stack directory; PostgreSQL and the registry are shared with it.
#
# Every topic gets 3 replicas and min.insync.replicas = 2 unless it says otherwise, the internal ones
# (offsets, transaction state, share state) too, and .stack/env sets CDC_TOPIC_REPLICATION_FACTOR=3 so that
# `cdc run` creates its topics with 3 replicas.

CLUSTER_BROKERS=(b1 b2 b3)
CLUSTER_NODES=(ctl "${CLUSTER_BROKERS[@]}")
CONTROLLER_NODE_ID=0
# The controller's data directory holds the ACLs' marker too (grant_kafka_acls).
[ "$BROKERS" = 3 ] && KAFKA_DATA=$KAFKA_HOME/data$MODE-ctl

node_data() { echo "$KAFKA_HOME/data$MODE-$1"; }
node_log() { echo "$STACK_DIR/logs/kafka$MODE-$1.log"; }
node_pid_file() { echo "$STACK_DIR/kafka$MODE-$1.pid"; }
node_properties() { echo "$KAFKA_HOME/server$MODE-$1.properties"; }
node_running() { [ -f "$(node_pid_file "$1")" ] && kill -0 "$(cat "$(node_pid_file "$1")")" 2>/dev/null; }
broker_port() { echo $((KAFKA_PORT + 10 * (${1#b} - 1))); }

# The clients' bootstrap list: every broker, so that any one of them may be down when a client starts.
cluster_bootstrap() {
    local b out=
    for b in "${CLUSTER_BROKERS[@]}"; do out="$out${out:+,}127.0.0.1:$(broker_port "$b")"; done
    echo "$out"
}

controller_properties() {
    cat <<EOF
# The three-broker cluster's dedicated KRaft controller (stack/cluster.sh), written by stack/stack.sh.
process.roles=controller
node.id=$CONTROLLER_NODE_ID
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
controller.listener.names=CONTROLLER
log.dirs=$(node_data ctl)
# Topic defaults are the controller's to apply in KRaft (it creates the topics): a topic created with the
# brokers' defaults alone got one replica and min.insync.replicas = 1. The brokers keep them too, as Kafka
# 4.4 still reads them there.
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
EOF
    if [ "$SECURE" = 1 ]; then
        # The brokers come with the stack's certificate (mutual TLS); ACL changes reach the controller, so it
        # authorizes too.
        cat <<EOF
listener.security.protocol.map=CONTROLLER:SSL
ssl.keystore.type=PEM
ssl.keystore.location=$SECURE_DIR/server-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$CA_FILE
ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;$BROKER_PRINCIPAL
allow.everyone.if.no.acl.found=false
EOF
    else
        echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT"
    fi
}

# broker_properties bN: the single broker's template, then what makes it one of three (later keys win).
broker_properties() {
    local node=$1 port internal
    port=$(broker_port "$node")
    internal=$((port + 5))
    sed -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
        -e "s|@DATA_DIR@|$(node_data "$node")|g" "$ROOT/stack/kafka/server.properties.in"
    if [ "$SECURE" = 1 ]; then
        # secure.sh's listeners name the controller's port, which a broker-only node may not listen on: the
        # broker's own follow.
        KAFKA_PORT=$port KAFKA_ADVERTISED_PORT=$port kafka_secure_properties "$internal"
        cat <<EOF
listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$internal
advertised.listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$internal
EOF
    else
        cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
EOF
    fi
    cat <<EOF
# --- three-broker cluster (stack/cluster.sh) ---
process.roles=broker
node.id=${node#b}
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
EOF
}

# format_cluster: a controller without storage means a new cluster: a new id, the controller formatted as
# the quorum's only voter (with the SCRAM users, in secure mode), and the brokers' storage of any earlier
# cluster wiped (a broker of another cluster id is refused by this one). A broker without storage alone (its
# directory removed) is formatted with the controller's id and joins again.
format_cluster() {
    local node data cluster_id scram=()
    if [ ! -f "$(node_data ctl)/meta.properties" ]; then
        say "formatting Kafka storage (KRaft, a dedicated controller and three brokers)"
        for node in "${CLUSTER_BROKERS[@]}"; do rm -rf "$(node_data "$node")"; done
        mkdir -p "$(node_data ctl)"
        cluster_id=$("${KAFKA_JAVA[@]}" kafka.tools.StorageTool random-uuid 2>>"$(node_log ctl)" | tail -n 1)
        [ "$SECURE" = 1 ] && mapfile -t scram < <(kafka_scram_args)
        "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" \
            -c "$(node_properties ctl)" "${scram[@]}" >>"$(node_log ctl)" 2>&1 ||
            fail "kafka storage format failed (controller)" "$(node_log ctl)"
    fi
    cluster_id=$(sed -n 's/^cluster.id=//p' "$(node_data ctl)/meta.properties")
    [ -n "$cluster_id" ] || fail "no cluster.id in $(node_data ctl)/meta.properties"
    for node in "${CLUSTER_BROKERS[@]}"; do
        data=$(node_data "$node")
        [ -f "$data/meta.properties" ] && continue
        mkdir -p "$data"
        "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$(node_properties "$node")" \
            >>"$(node_log "$node")" 2>&1 || fail "kafka storage format failed ($node)" "$(node_log "$node")"
    done
}

# launch_node NODE: start it in the background, its log appended to (what a killed broker wrote before it
# died stays for the fault suite to read); LAUNCHED_AT is the line of its log after which its start is to be
# looked for.
launch_node() {
    local node=$1 log heap=-Xmx1g
    log=$(node_log "$node")
    touch "$log"
    LAUNCHED_AT=$(wc -l <"$log")
    [ "$node" = ctl ] && heap=-Xmx256m
    printf '[%s] stack: starting %s\n' "$(date '+%F %T')" "$node" >>"$log"
    # setsid: the node must outlive this script but not take its terminal's signals. The later -Xmx wins.
    setsid "${KAFKA_JAVA[@]}" "$heap" kafka.Kafka "$(node_properties "$node")" >>"$log" 2>&1 </dev/null &
    echo $! >"$(node_pid_file "$node")"
}

# wait_nodes_started TIMEOUT NODE:LINE...: until each node has said "Kafka Server started" after LINE of its
# log (a broker says so once the controller has unfenced it), or fail.
wait_nodes_started() {
    local timeout=$1 i spec node line pending
    shift
    for i in $(seq 1 $((timeout * 2))); do
        pending=0
        for spec in "$@"; do
            node=${spec%%:*} line=${spec#*:}
            if ! node_running "$node"; then
                rm -f "$(node_pid_file "$node")"
                fail "kafka $node exited during start-up" "$(node_log "$node")"
            fi
            tail -n +$((line + 1)) "$(node_log "$node")" | grep -q "Kafka Server started" || pending=1
        done
        [ "$pending" = 0 ] && return 0
        sleep 0.5
    done
    fail "kafka $* not started after $timeout s" "$(node_log "${spec%%:*}")"
}

start_kafka_cluster() {
    ensure_kafka_installed
    kafka_java_args
    [ "$SECURE" = 1 ] && ensure_tls
    local node port starting=()
    for node in "${CLUSTER_NODES[@]}"; do
        if [ "$node" = ctl ]; then controller_properties; else broker_properties "$node"; fi \
            >"$(node_properties "$node")"
    done
    if ! node_running ctl; then
        port_open "$KAFKA_CONTROLLER_PORT" &&
            fail "port $KAFKA_CONTROLLER_PORT is taken by a process this stack did not start (set CDC_STACK_KAFKA_CONTROLLER_PORT)"
        format_cluster
        say "starting the kafka controller on 127.0.0.1:$KAFKA_CONTROLLER_PORT"
        launch_node ctl
        wait_nodes_started 60 "ctl:$LAUNCHED_AT"
    else
        format_cluster # a broker whose storage was removed
    fi
    for node in "${CLUSTER_BROKERS[@]}"; do
        port=$(broker_port "$node")
        if node_running "$node"; then
            say "kafka $node already running on 127.0.0.1:$port (pid $(cat "$(node_pid_file "$node")"))"
            continue
        fi
        port_open "$port" && fail "port $port is taken by a process this stack did not start (set CDC_STACK_KAFKA_PORT)"
        say "starting kafka $node on 127.0.0.1:$port"
        launch_node "$node"
        starting+=("$node:$LAUNCHED_AT")
    done
    # Three JVMs starting at once on a small machine: 120 s.
    [ ${#starting[@]} -gt 0 ] && wait_nodes_started 120 "${starting[@]}"
    [ "$SECURE" = 1 ] && grant_kafka_acls
    return 0
}

# stop_cluster: the brokers first, together (SIGTERM is a controlled shutdown: the controller moves their
# leaderships away, which it can only do while it runs), then the controller. 30 s each before SIGKILL.
stop_cluster() {
    local mode node pid pids=()
    for mode in "" -secure; do
        for node in "${CLUSTER_BROKERS[@]}"; do
            pid=$(cat "$STACK_DIR/kafka$mode-$node.pid" 2>/dev/null) || continue
            if kill -0 "$pid" 2>/dev/null; then
                say "stopping kafka$mode $node (pid $pid)"
                kill -TERM "$pid" 2>/dev/null || true
                pids+=("$pid")
            fi
        done
        for pid in "${pids[@]}"; do wait_or_kill "kafka broker pid $pid" "$pid"; done
        pids=()
        for node in "${CLUSTER_BROKERS[@]}"; do rm -f "$STACK_DIR/kafka$mode-$node.pid"; done
        [ -f "$STACK_DIR/kafka$mode-ctl.pid" ] &&
            stop_by_pid_file "kafka$mode controller" "$STACK_DIR/kafka$mode-ctl.pid"
    done
    return 0
}

# cluster_status: one line a node; 1 when one of them is not running.
cluster_status() {
    local node rc=0 where
    for node in "${CLUSTER_NODES[@]}"; do
        if [ "$node" = ctl ]; then where="$KAFKA_CONTROLLER_PORT (controller)"; else where=$(broker_port "$node"); fi
        if node_running "$node"; then
            say "kafka $node: running on 127.0.0.1:$where, pid $(cat "$(node_pid_file "$node")") (log $(node_log "$node"))"
        else
            say "kafka $node: stopped"
            rc=1
        fi
    done
    return $rc
}

# The cluster's part of .stack/env.
cluster_env() {
    cat <<EOF
# The three-broker cluster (CDC_STACK_KAFKA_BROKERS=3, stack/cluster.sh): cdc run creates topics with 3 replicas.
export CDC_STACK_KAFKA_BROKERS='3'
export CDC_TOPIC_REPLICATION_FACTOR='3'
EOF
}
