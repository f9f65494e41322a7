# The tracing backend (CDC_STACK_TRACING=1), sourced by stack/stack.sh: Jaeger, the
# github.com/jaegertracing/jaeger/cmd/jaeger program (Jaeger v2, an OpenTelemetry Collector build) of the
# release that stack/jaeger/go.mod requires, built from the Go module proxy with the machine's Go into
# .stack/jaeger/bin/jaeger. It is built once and again only when stack/jaeger/go.mod or go.sum change; Go's own
# caches (the module cache and the build cache) make a rebuild after `stack.sh clean` quick too.
#
# Why a module of our own rather than `go install ...@v1.75.0`: Jaeger's go.mod has a replace directive, which
# `go install pkg@version` refuses. stack/jaeger/go.mod requires the program as a tool (`go get -tool`) with the
# same replace, and go.sum pins every module it builds from.
#
# Ports: OTLP over gRPC on CDC_STACK_JAEGER_OTLP_GRPC_PORT (4317) and over HTTP on
# CDC_STACK_JAEGER_OTLP_HTTP_PORT (4318), their usual ports; the query API and UI on CDC_STACK_JAEGER_PORT
# (16686), its query gRPC API one below it. All on 127.0.0.1, traces in memory (stack/jaeger/config.yaml.in).
# `up` writes OTEL_EXPORTER_OTLP_ENDPOINT (OTLP/HTTP, what `cdc run` exports with) and CDC_STACK_JAEGER_URL (the
# query API) into .stack/env while it runs; `down` stops it.

TRACING=${CDC_STACK_TRACING:-0}
case "$TRACING" in
    0 | 1) ;;
    "") TRACING=0 ;;
    *) printf 'stack: FAILED: CDC_STACK_TRACING=%s is not 0 or 1\n' "$TRACING" >&2 && exit 2 ;;
esac
JAEGER_OTLP_GRPC_PORT=${CDC_STACK_JAEGER_OTLP_GRPC_PORT:-4317}
JAEGER_OTLP_HTTP_PORT=${CDC_STACK_JAEGER_OTLP_HTTP_PORT:-4318}
JAEGER_PORT=${CDC_STACK_JAEGER_PORT:-16686}
JAEGER_HOME=$STACK_DIR/jaeger
JAEGER_BIN=$JAEGER_HOME/bin/jaeger
JAEGER_PID=$STACK_DIR/jaeger.pid
JAEGER_LOG=$STACK_DIR/logs/jaeger.log
# What the running Jaeger listens on, for write_env and status: written when it starts.
JAEGER_ENV=$JAEGER_HOME/env
JAEGER_GO_MIN=1.24

jaeger_running() { [ -f "$JAEGER_PID" ] && kill -0 "$(cat "$JAEGER_PID")" 2>/dev/null; }

jaeger_build_key() { cat "$ROOT/stack/jaeger/go.mod" "$ROOT/stack/jaeger/go.sum" | sha256sum | cut -d' ' -f1; }

ensure_jaeger_built() {
    local want
    want=$(jaeger_build_key)
    if [ -x "$JAEGER_BIN" ] && [ "$(cat "$JAEGER_HOME/.built" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    command -v go >/dev/null 2>&1 || [ ! -x /usr/local/go/bin/go ] || PATH=/usr/local/go/bin:$PATH
    command -v go >/dev/null 2>&1 ||
        fail "Go $JAEGER_GO_MIN or later is needed to build Jaeger (https://go.dev/doc/install), or leave CDC_STACK_TRACING unset"
    local have
    have=$(go env GOVERSION | sed 's/^go//')
    if [ "$(printf '%s\n%s\n' "$JAEGER_GO_MIN" "$have" | sort -V | head -n 1)" != "$JAEGER_GO_MIN" ]; then
        fail "Go $have is too old to build Jaeger: $JAEGER_GO_MIN or later is needed"
    fi
    say "building Jaeger ($(jaeger_version)) from the Go module proxy (first run only, a few minutes)"
    mkdir -p "$JAEGER_HOME/bin"
    local started=$SECONDS
    # readonly: go.sum must already hold every module (a build never edits it); no VCS stamp, which would
    # ask git about the checkout (as root, another user's clone is "dubious ownership").
    (cd "$ROOT/stack/jaeger" && GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$JAEGER_BIN.new" \
        github.com/jaegertracing/jaeger/cmd/jaeger) >"$STACK_DIR/logs/jaeger-build.log" 2>&1 ||
        fail "go build of github.com/jaegertracing/jaeger/cmd/jaeger failed" "$STACK_DIR/logs/jaeger-build.log"
    mv "$JAEGER_BIN.new" "$JAEGER_BIN"
    echo "$want" >"$JAEGER_HOME/.built"
    say "built Jaeger in $((SECONDS - started)) s"
}

jaeger_version() { sed -n 's|^\s*github.com/jaegertracing/jaeger \(v[^ ]*\).*|\1|p' "$ROOT/stack/jaeger/go.mod" | head -n 1; }

# The query API answers with the services it knows, a JSON object.
jaeger_answers() {
    local out
    out=$(curl -sf --max-time 5 "http://127.0.0.1:$JAEGER_PORT/api/services" 2>/dev/null) || return 1
    [[ $out == \{* ]] && port_open "$JAEGER_OTLP_HTTP_PORT"
}

start_jaeger() {
    if jaeger_running; then
        say "jaeger already running (pid $(cat "$JAEGER_PID")); $(sed -n '1s/^# //p' "$JAEGER_ENV" 2>/dev/null)"
        return 0
    fi
    ensure_jaeger_built
    command -v curl >/dev/null 2>&1 || apt_install curl
    local port
    for port in "$JAEGER_OTLP_GRPC_PORT" "$JAEGER_OTLP_HTTP_PORT" "$JAEGER_PORT" $((JAEGER_PORT - 1)); do
        if port_open "$port"; then
            fail "port $port is taken by a process this stack did not start (set CDC_STACK_JAEGER_OTLP_GRPC_PORT, CDC_STACK_JAEGER_OTLP_HTTP_PORT or CDC_STACK_JAEGER_PORT)"
        fi
    done
    sed -e "s|@OTLP_GRPC_PORT@|$JAEGER_OTLP_GRPC_PORT|g" -e "s|@OTLP_HTTP_PORT@|$JAEGER_OTLP_HTTP_PORT|g" \
        -e "s|@QUERY_PORT@|$JAEGER_PORT|g" -e "s|@QUERY_GRPC_PORT@|$((JAEGER_PORT - 1))|g" \
        "$ROOT/stack/jaeger/config.yaml.in" >"$JAEGER_HOME/config.yaml"
    say "starting jaeger: OTLP on 127.0.0.1:$JAEGER_OTLP_GRPC_PORT (gRPC) and :$JAEGER_OTLP_HTTP_PORT (HTTP), query on :$JAEGER_PORT"
    (cd "$JAEGER_HOME" && exec setsid "$JAEGER_BIN" --config "$JAEGER_HOME/config.yaml") \
        >"$JAEGER_LOG" 2>&1 </dev/null &
    echo $! >"$JAEGER_PID"
    local i
    for i in $(seq 1 120); do
        if ! jaeger_running; then
            rm -f "$JAEGER_PID"
            fail "jaeger exited during start-up" "$JAEGER_LOG"
        fi
        if jaeger_answers; then
            cat >"$JAEGER_ENV" <<EOF
# OTLP on 127.0.0.1:$JAEGER_OTLP_GRPC_PORT and :$JAEGER_OTLP_HTTP_PORT, query API on http://127.0.0.1:$JAEGER_PORT
# Jaeger (CDC_STACK_TRACING=1): OTLP over HTTP for \`cdc run\` and the tests; the query API and UI.
export OTEL_EXPORTER_OTLP_ENDPOINT='http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT'
export CDC_STACK_JAEGER_URL='http://127.0.0.1:$JAEGER_PORT'
EOF
            return 0
        fi
        sleep 0.5
    done
    fail "jaeger does not answer on 127.0.0.1:$JAEGER_PORT after 60 s" "$JAEGER_LOG"
}

stop_jaeger() { [ ! -f "$JAEGER_PID" ] || stop_by_pid_file jaeger "$JAEGER_PID"; }

jaeger_status() {
    if jaeger_running; then
        say "jaeger:   running, pid $(cat "$JAEGER_PID"); $(sed -n '1s/^# //p' "$JAEGER_ENV" 2>/dev/null) (log $JAEGER_LOG)"
    elif [ "$TRACING" = 1 ]; then
        say "jaeger:   stopped"
        return 1
    fi
}

# Its lines of .stack/env, while it runs.
jaeger_env() { jaeger_running && sed -n '2,$p' "$JAEGER_ENV"; }
