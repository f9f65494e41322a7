"""Observability: Prometheus ``/metrics``, ``/healthz`` (alive) and ``/readyz`` (streaming, broker reachable).

Nothing here runs per event. The pipeline keeps plain counters as it goes; a collector reads them when
Prometheus scrapes, on the HTTP server's thread (reading ints and a list the main thread writes is safe under
the GIL, and a scrape that is one event behind is fine). A scrape also says whether the pipeline is ready
(``cdc_ready``, what ``/readyz`` answers; ``cdc_standby``, a standby waiting for the slot, which is not ready
by design) and what the server says of the slot (``cdc_slot_active``,
``cdc_slot_retained_wal_bytes``, from ``pg_replication_slots`` on the scrape thread's own connection), each
asked at most every READY_CACHE_SECONDS. ``deploy/`` has a Grafana dashboard and Prometheus alert rules
built on these names (docs/operations.md, "Monitoring").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from cdc.errors import ConfigError, SourceConnectionError, first_line
from cdc.pg import connect, database_dsn
from cdc.tracing import TracingCollector

if TYPE_CHECKING:
    from cdc.stream.pipeline import Pipeline

log = logging.getLogger("cdc.metrics")

# Upper bounds (ms) of the commit-to-ack histogram's buckets.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class PipelineCollector(Collector):
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Any]:
        p = self.pipeline
        published = CounterMetricFamily(
            "cdc_events_published", "Events handed to Kafka, by topic", labels=["topic"]
        )
        for topic, count in list(p.published_by_topic.items()):
            published.add_metric([topic], count)
        yield published
        dead = CounterMetricFamily(
            "cdc_dead_letter_events", "Events sent to the dead-letter topic", labels=["reason"]
        )
        for reason, count in list(p.dead_lettered_by_reason.items()):
            dead.add_metric([reason], count)
        yield dead
        yield CounterMetricFamily("cdc_delivery_errors", "Deliveries Kafka refused", value=p.delivery_errors)
        yield CounterMetricFamily("cdc_reconnects", "Reconnections to PostgreSQL", value=p.reconnects)
        kafka_txns = CounterMetricFamily(
            "cdc_kafka_transactions",
            "Kafka transactions of delivery = exactly-once, by outcome",
            labels=["outcome"],
        )
        kafka_txns.add_metric(["committed"], p.kafka_commits)
        kafka_txns.add_metric(["aborted"], p.kafka_aborts)
        yield kafka_txns
        yield CounterMetricFamily(
            "cdc_skipped_source_transactions",
            "Source transactions skipped because a committed checkpoint covers them (exactly-once)",
            value=p.skipped_transactions,
        )
        yield CounterMetricFamily(
            "cdc_refusal_replays",
            "Times Kafka refused records and the stream was replayed to dead-letter the culprit",
            value=p.refusal_replays,
        )
        yield CounterMetricFamily(
            "cdc_ignored_outbox_messages",
            "Non-transactional 'outbox' logical messages, which are not events",
            value=p.ignored_messages,
        )
        yield GaugeMetricFamily(
            "cdc_confirmed_lsn", "LSN confirmed to the slot", value=p.tracker.confirmed_lsn
        )
        yield GaugeMetricFamily(
            "cdc_replication_lag_bytes",
            "Server WAL end (last keepalive or message) minus the confirmed LSN",
            value=max(0, p.server_wal_end - p.tracker.confirmed_lsn),
        )
        yield GaugeMetricFamily(
            "cdc_producer_queue_depth", "Records waiting for Kafka", value=p.sink.queue_depth()
        )
        if p.slot_watch.count is not None:
            yield GaugeMetricFamily(
                "cdc_replication_slots",
                "Replication slots on the cluster, ours included, at the pipeline's last look",
                value=p.slot_watch.count,
            )
        yield CounterMetricFamily(
            "cdc_replication_slot_changes",
            "Replication slots created or dropped on the cluster since the pipeline started (each is logged)",
            value=p.slot_watch.changes,
        )
        silent = p.seconds_since_server_message()
        if silent is not None:  # not streaming: no value (cdc_ready says why)
            yield GaugeMetricFamily(
                "cdc_seconds_since_last_server_message",
                "Seconds since PostgreSQL's replication stream last sent anything (data or keepalive)",
                value=silent,
            )
        yield GaugeMetricFamily(
            "cdc_in_flight_events", "Events produced, not yet acknowledged", value=p.tracker.in_flight
        )
        state = GaugeMetricFamily(
            "cdc_pipeline_state",
            "The stream's life: 1 for its state now (starting, standby, streaming, waiting, reconnecting, "
            "draining, stopped), 0 for the others",
            labels=["state"],
        )
        for name, value in p.life.gauge().items():
            state.add_metric([name], value)
        yield state
        yield GaugeMetricFamily(
            "cdc_compiled_hot_path",
            "1: outbox rows are read and encoded by the compiled extension (fast_path); 0: by Python alone",
            value=int(p.schemas.compiled),
        )
        yield CounterMetricFamily(
            "cdc_heartbeats_seen", "Heartbeat messages read back from the stream", value=p.heartbeat.seen
        )
        yield GaugeMetricFamily(
            "cdc_last_heartbeat_seen_timestamp_seconds",
            "Unix time the last heartbeat came back on the stream (0: none yet)",
            value=p.heartbeat.last_seen,
        )
        yield GaugeMetricFamily(
            "cdc_dead_letter_brake_limit",
            "max_dead_letters: dead letters within dead_letter_window that stop the run (0: off)",
            value=p.settings.max_dead_letters or 0,
        )
        yield GaugeMetricFamily(
            "cdc_dead_letters_in_window",
            "Dead letters within the last dead_letter_window, as the brake counts them (0 when it is off)",
            value=p.dead_letters_in_window(),
        )
        reloads = CounterMetricFamily(
            "cdc_schema_reloads",
            "Re-reads of schemas_dir (a miss or SIGHUP), by outcome: used, unchanged, refused",
            labels=["outcome"],
        )
        for outcome, count in list(p.schemas.reloads.items()):
            reloads.add_metric([outcome], count)
        yield reloads
        yield _latency_histogram(p)


class ServerCollector(Collector):
    """What the metrics server learns at a scrape, cached: readiness and the slot as the server sees it."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "cdc_ready",
            "1 when /readyz answers ready (streaming, Kafka answers)",
            value=not self.server.not_ready(),
        )
        yield GaugeMetricFamily(
            "cdc_standby",
            "1 while a standby waits for the slot (on_slot_active = wait): not ready, and not to alert on",
            value=self.server.standing_by(),
        )
        yield CounterMetricFamily(
            "cdc_metrics_connections_refused",
            f"Connections to the metrics port answered 503 at once: {MAX_CONNECTIONS} were open already",
            value=self.server.refused,
        )
        slot = self.server.slot()
        if slot is None:
            return  # PostgreSQL did not answer: no value rather than a wrong one (cdc_ready says why)
        active, retained = slot
        yield GaugeMetricFamily(
            "cdc_slot_active",
            "1 while a process streams from the slot (pg_replication_slots.active)",
            value=active,
        )
        if retained is not None:
            yield GaugeMetricFamily(
                "cdc_slot_retained_wal_bytes",
                "WAL the slot keeps on the server: its restart_lsn to the current WAL position",
                value=retained,
            )


def _latency_histogram(p: Pipeline) -> HistogramMetricFamily:
    counts = p.latency.counts
    buckets: list[tuple[str, float]] = []
    running = 0
    previous = 0
    for bound in LATENCY_BUCKETS_MS:
        running += sum(counts[previous : bound + 1])
        previous = bound + 1
        buckets.append((str(bound / 1000), running))
    buckets.append(("+Inf", p.latency.total))
    return HistogramMetricFamily(
        "cdc_commit_to_ack_seconds",
        "Commit-to-ack latency, per event (its transaction's last acknowledgement)",
        buckets=buckets,
        sum_value=p.latency.sum_ms / 1000,
    )


REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request (and to read the answer)


class _Quiet(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT  # the socket's: a connection that sends nothing is dropped, not waited on

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("metrics: " + format, *args)


MAX_CONNECTIONS = 32  # connections served at once; the next ones are answered 503 at once and closed
REFUSAL_LOG_SECONDS = 60.0  # at most one warning this often while connections are refused
_BUSY_BODY = b"busy: too many connections to the metrics port\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, up to MAX_CONNECTIONS: one client that connects and says nothing (a stuck
    probe, a port scan) must not keep /healthz from answering the next, which a liveness probe would take for
    a dead pipeline; and a hundred must not start a hundred threads. Above the cap a connection is answered
    503 at once, on the accepting thread, without reading its request: a probe then fails fast instead of
    hanging, and the silent connections holding the threads are dropped after REQUEST_TIMEOUT."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 would leave a burst's SYNs unanswered)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        self._warned = -REFUSAL_LOG_SECONDS
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)  # starts the thread, which releases the slot
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _refuse(self, request: Any) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._warned >= REFUSAL_LOG_SECONDS:
            self._warned = now
            log.warning(
                "metrics: %d connections are open to the metrics port, its cap: answering the next ones 503 "
                "(%d refused so far); who holds them? (metrics_host should not face untrusted networks)",
                MAX_CONNECTIONS,
                self.refused,
            )
        try:
            request.setblocking(False)  # never wait here: this is the thread that accepts
            with contextlib.suppress(BlockingIOError):
                request.recv(65536)  # what the client sent already: closing over unread data would reset
            request.send(_BUSY)  # a fresh connection's send buffer holds it whole
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics: a request from %s failed", client_address, exc_info=True)


READY_CACHE_SECONDS = 2.0  # /readyz asks Kafka at most this often, however often it is probed


class MetricsServer:
    """The HTTP endpoint on ``metrics_host:metrics_port``: loopback by default, so that nothing is exposed
    that was not asked for (a container sets ``metrics_host = "0.0.0.0"`` to be scraped from outside)."""

    def __init__(
        self,
        pipeline: Pipeline,
        port: int,
        host: str = "127.0.0.1",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PipelineCollector(pipeline))
        registry.register(ServerCollector(self))
        registry.register(TracingCollector())  # spans dropped and exported (cdc.tracing)
        self._metrics = make_wsgi_app(registry)
        self._pipeline = pipeline
        self._clock = clock
        self._ready: tuple[float, list[str]] | None = None  # (when asked, reasons)
        self._ready_lock = threading.Lock()
        self._slot: tuple[float, tuple[bool, int | None] | None] | None = None  # (when asked, answer)
        self._slot_conn: psycopg.Connection[Any] | None = None
        try:
            self._server: WSGIServer = make_server(
                host, port, self._app, server_class=_Server, handler_class=_Quiet
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror}; choose another metrics_port "
                "(or metrics_host)",
                key="metrics_port",
            ) from exc
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="cdc-metrics", daemon=True)

    def standing_by(self) -> bool:
        """Whether the pipeline is a standby that waits for the slot."""
        return self._pipeline.standing_by

    @property
    def refused(self) -> int:
        """Connections answered 503 because MAX_CONNECTIONS were open."""
        server = self._server
        return server.refused if isinstance(server, _Server) else 0

    def not_ready(self) -> list[str]:
        """The pipeline's reasons not to be ready, asked at most every READY_CACHE_SECONDS: each ask is a
        broker round trip, and a probe every few hundred ms should not become Kafka traffic."""
        with self._ready_lock:
            now = self._clock()
            if self._ready is None or now - self._ready[0] >= READY_CACHE_SECONDS:
                self._ready = (now, self._pipeline.not_ready())
            return self._ready[1]

    def slot(self) -> tuple[bool, int | None] | None:
        """(active, retained WAL bytes) of the slot from pg_replication_slots, asked at most every
        READY_CACHE_SECONDS; None when PostgreSQL does not answer or the slot is missing."""
        with self._ready_lock:
            now = self._clock()
            if self._slot is None or now - self._slot[0] >= READY_CACHE_SECONDS:
                self._slot = (now, self._ask_slot())
            return self._slot[1]

    def _ask_slot(self) -> tuple[bool, int | None] | None:
        settings = self._pipeline.settings
        try:
            if self._slot_conn is None or self._slot_conn.closed:
                self._slot_conn = connect(database_dsn(settings), timeout=READY_CACHE_SECONDS + 1)
                self._slot_conn.execute("SELECT set_config('statement_timeout', '2000ms', false)")
            row = self._slot_conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (settings.slot,),
            ).fetchone()
        except (psycopg.Error, SourceConnectionError) as exc:
            log.debug("metrics: the slot's state is unknown: %s", first_line(exc))
            if self._slot_conn is not None:
                self._slot_conn.close()
                self._slot_conn = None
            return None
        return None if row is None else (bool(row[0]), None if row[1] is None else int(row[1]))

    def start(self) -> None:
        self._thread.start()
        log.info("metrics on %s:%d (/metrics, /healthz, /readyz)", self.host, self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._ready_lock:
            if self._slot_conn is not None:
                self._slot_conn.close()
                self._slot_conn = None

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            stuck = self._pipeline.alive()
            if stuck is not None:
                return _text(start_response, "503 Service Unavailable", stuck + "\n")
            return _text(start_response, "200 OK", "alive\n")
        if path == "/readyz":
            reasons = self.not_ready()
            if reasons:
                return _text(start_response, "503 Service Unavailable", "; ".join(reasons) + "\n")
            return _text(start_response, "200 OK", "ready\n")
        if path == "/metrics":
            result: Iterable[bytes] = self._metrics(environ, start_response)
            return result
        return _text(start_response, "404 Not Found", "not found\n")


def _text(start_response: StartResponse, status: str, body: str) -> list[bytes]:
    data = body.encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
    )
    return [data]
