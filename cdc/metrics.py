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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cdc.errors import ConfigError, SourceConnectionError, first_line
from cdc.pg import connect, database_dsn
from cdc.pipeline_metrics import PipelineCollector
from cdc.tracing import TracingCollector

if TYPE_CHECKING:
    from cdc.stream.pipeline import Pipeline

log = logging.getLogger("cdc.metrics")


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


StartResponse = Callable[[str, list[tuple[str, str]]], Any]

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
