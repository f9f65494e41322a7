"""OpenTelemetry's SDK in outbox CDC: set up from the ``OTEL_*`` environment, exporting without ever blocking.

:func:`start` configures the SDK for the ``tracing`` setting from OpenTelemetry's own variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` and ``_ARG``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_TIMEOUT``...) and exports OTLP over HTTP (``opentelemetry-exporter-otlp-proto-http``: no
gRPC runtime in the process, and Jaeger, Tempo and the Collector all take it on 4318). It returns None when
tracing is off: the setting says so, ``OTEL_SDK_DISABLED=true``, or the SDK is not installed (it is the
optional extra ``outbox-cdc[otel]``), and everything else works as without it.

Ended spans go to a BatchSpanProcessor whose queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``, 2048): the thread
that ends a span only appends to it, and the processor's own thread exports, each request bounded by
``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s). When the collector is slow or gone the queue fills and spans are
dropped, never events: every lost span is counted in ``cdc_tracing_spans_dropped_total{reason}``
(:class:`TracingCollector`, which :mod:`cdc.metrics` serves). :meth:`Tracing.shutdown` waits for the queue at
most as long as its caller says. The W3C context of rows and records is :mod:`cdc.trace_context`'s.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cdc import trace_export
from cdc.config import TRACING_MODES as MODES
from cdc.errors import ConfigError

try:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
except ImportError:  # the [otel] extra is not installed: start() says tracing is off
    SDK = False
    SpanProcessor = SpanExporter = object  # type: ignore[misc,assignment]
else:
    SDK = True

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span
    from opentelemetry.trace import Tracer

__all__ = ["MODES", "STATS", "SpanStats", "Tracing", "TracingCollector", "start"]

log = logging.getLogger("cdc.tracing")

INSTRUMENTATION = "outbox-cdc"
DEFAULT_QUEUE = 2048  # OpenTelemetry's defaults of OTEL_BSP_MAX_QUEUE_SIZE and _MAX_EXPORT_BATCH_SIZE
DEFAULT_BATCH = 512
_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class SpanStats:
    """What became of the process's finished spans: plain counters under a lock, read at each scrape."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exported = 0
        self.dropped: dict[str, int] = {"queue_full": 0, "export_failed": 0, "shutdown": 0}
        self.queued = 0  # in the batch queues now


STATS = SpanStats()


class TracingCollector(Collector):
    """``cdc_tracing_spans_dropped_total{reason}``, ``cdc_tracing_spans_exported_total`` and
    ``cdc_tracing_queued_spans``, for a Prometheus registry."""

    def __init__(self, stats: SpanStats = STATS) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        s = self.stats
        dropped = CounterMetricFamily(
            "cdc_tracing_spans_dropped",
            "Spans lost (never events): queue_full, the collector slower than the spans come; "
            "export_failed, the collector refused them or could not be reached; shutdown, left at exit",
            labels=["reason"],
        )
        for reason, count in list(s.dropped.items()):
            dropped.add_metric([reason], count)
        yield dropped
        yield CounterMetricFamily("cdc_tracing_spans_exported", "Spans the collector took", value=s.exported)
        yield GaugeMetricFamily("cdc_tracing_queued_spans", "Spans waiting to be exported", value=s.queued)


class Tracing:
    """OpenTelemetry's SDK as :func:`start` set it up: :attr:`tracer` makes the spans; :attr:`mode` is the
    ``tracing`` setting (``row-context-only`` or ``always``)."""

    def __init__(self, mode: str, provider: TracerProvider, processor: _BoundedProcessor) -> None:
        self.mode = mode
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(INSTRUMENTATION)
        self._processor = processor
        self._closed = False

    def shutdown(self, timeout: float) -> None:
        """Export what is queued, for at most ``timeout`` seconds (the caller's own shutdown bound); what is
        left then is dropped and counted (``shutdown``). Never waits longer, even with the collector gone."""
        if self._closed:
            return
        self._closed = True
        done = threading.Event()

        def close() -> None:
            self.provider.shutdown()
            done.set()

        threading.Thread(target=close, name="cdc-tracing-shutdown", daemon=True).start()
        if not done.wait(timeout):
            log.warning(
                "tracing: the collector took more than %.1f s at shutdown; its spans are dropped", timeout
            )
        self._processor.abandon()


class _CountingExporter(SpanExporter):
    """The OTLP exporter, telling the processor what left its queue and counting what the collector took.

    It encodes with :mod:`cdc.trace_export` (a tenth of the library's cost, the same bytes) and hands the
    bytes to the OTLP exporter's HTTP client, which keeps its endpoint, headers, TLS, compression, timeout
    and retries. That client is not public API: when an exporter of another version has none, or a batch
    holds what cdc.trace_export leaves to the library, the exporter encodes as it always does."""

    def __init__(self, inner: SpanExporter, processor: _BoundedProcessor) -> None:
        self.inner = inner
        self.processor = processor
        client = getattr(inner, "_client", None)
        self._client = client if callable(getattr(client, "export", None)) else None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.processor.taken(len(spans)):
            return SpanExportResult.FAILURE  # after shutdown's bound: counted as dropped by abandon()
        try:
            result = self._export(spans)
        except Exception:  # an exporter's bug must not end the export thread: the spans are counted
            log.exception("tracing: exporting %d spans failed", len(spans))
            result = SpanExportResult.FAILURE
        with STATS.lock:
            if result is SpanExportResult.SUCCESS:
                STATS.exported += len(spans)
            else:
                STATS.dropped["export_failed"] += len(spans)
        return result

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = None if self._client is None else trace_export.encode(spans)
        if data is None:
            return self.inner.export(spans)
        sent = self._client.export(data)  # type: ignore[union-attr]  # None was ruled out above
        return SpanExportResult.SUCCESS if getattr(sent, "success", False) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _BoundedProcessor(SpanProcessor):
    """A BatchSpanProcessor whose queue is never full: a span that might not fit is dropped here, and
    counted, before the SDK would drop one uncounted. The queue's length is what went in less what the
    exporter took; an export takes its spans just after they leave the queue, so the count is never below
    the real length."""

    def __init__(self, exporter: SpanExporter | None, capacity: int) -> None:
        self.capacity = capacity
        self.abandoned = False
        self._lock = threading.Lock()
        self._pending = 0
        self._batch: BatchSpanProcessor | None = None
        if exporter is not None:
            counting = _CountingExporter(exporter, self)
            self._batch = BatchSpanProcessor(counting, max_queue_size=capacity)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        batch = self._batch
        if batch is None or span.context is None or not span.context.trace_flags.sampled:
            return  # the SDK's processor exports sampled spans only
        with self._lock:
            lost = "shutdown" if self.abandoned else "queue_full" if self._pending >= self.capacity else ""
            if not lost:
                self._pending += 1
        with STATS.lock:
            if lost:
                STATS.dropped[lost] += 1
            else:
                STATS.queued += 1
        if not lost:
            batch.on_end(span)

    def taken(self, count: int) -> bool:
        """``count`` spans left the queue for an export; False once abandoned, which counted them."""
        with self._lock:
            if self.abandoned:
                return False
            self._pending -= count
        with STATS.lock:
            STATS.queued -= count
        return True

    def abandon(self) -> None:
        """After shutdown: what is still queued is lost, and counted now."""
        with self._lock:
            self.abandoned = True
            left, self._pending = self._pending, 0
        with STATS.lock:
            STATS.queued -= left
            STATS.dropped["shutdown"] += left

    def shutdown(self) -> None:
        if self._batch is not None:
            self._batch.shutdown()  # type: ignore[no-untyped-call]  # untyped in the SDK

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True if self._batch is None else self._batch.force_flush(timeout_millis)


def start(mode: str, *, service_name: str = INSTRUMENTATION) -> Tracing | None:
    """Set OpenTelemetry's SDK up from the ``OTEL_*`` environment for ``mode`` (the ``tracing`` setting), or
    None when tracing is off (said in the log). ``service_name`` is the default of ``OTEL_SERVICE_NAME``.
    Raises ConfigError naming the ``OTEL_*`` variable this install cannot honour, and the fix."""
    if mode not in MODES:
        raise ConfigError(f"setting 'tracing' is one of {', '.join(MODES)}, not {mode!r}", key="tracing")
    if mode == "off":
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("tracing is off: OTEL_SDK_DISABLED=true")
        return None
    if not SDK:
        log.info("tracing is off: OpenTelemetry's SDK is not installed (pip install 'outbox-cdc[otel]')")
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    _check_environment()
    exporter = _exporter()
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    # Its sampler comes from OTEL_TRACES_SAMPLER and _ARG (parentbased_always_on by default: a row's sampled
    # flag decides). No exit hook: it would wait up to 30 s for a collector that is gone.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    processor = _BoundedProcessor(exporter, _int_env("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE))
    provider.add_span_processor(processor)
    log.info(
        "tracing: %s, service %s, exporting to %s, sampler %s",
        mode,
        resource.attributes.get(SERVICE_NAME),
        _shown(_endpoint()) if exporter is not None else "nowhere (OTEL_TRACES_EXPORTER=none)",
        os.environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on",
    )
    return Tracing(mode, provider, processor)


def _check_environment() -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            raise ConfigError(
                f"{name}={protocol!r}: outbox CDC exports OTLP over HTTP only; unset it or set "
                "http/protobuf, with the collector's OTLP/HTTP endpoint (port 4318) in "
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                key=name,
            )
        if protocol:
            break
    sampler = os.environ.get("OTEL_TRACES_SAMPLER", "").strip()
    if sampler and sampler not in _SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER={sampler!r} is not one of {', '.join(_SAMPLERS)}", key="OTEL_TRACES_SAMPLER"
        )
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if arg and sampler.endswith("traceidratio"):
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio from 0 to 1 (0.01: one trace in a hundred)",
                key="OTEL_TRACES_SAMPLER_ARG",
            )
    for name in ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        _int_env(name, 1)
    queue = _int_env("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)
    batch = _int_env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH)
    if batch > queue:
        raise ConfigError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE ({batch}) is larger than OTEL_BSP_MAX_QUEUE_SIZE ({queue}): "
            "set it to the queue's size or less",
            key="OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        )


def _int_env(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{name}={text!r} is not a positive whole number", key=name)
    return int(text)


def _endpoint() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def _shown(url: str) -> str:
    """The endpoint for the log: its scheme, host, port and path; a user, password or query (where
    collectors' tokens go) left out."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an endpoint that does not parse)"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    secret = parts.username or parts.password or parts.query
    hidden = " (its credentials and query not shown)" if secret else ""
    return f"{parts.scheme}://{host}{port}{parts.path}{hidden}"


def _exporter() -> SpanExporter | None:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    if kind == "none":
        return None
    if kind != "otlp":
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={kind!r}: outbox CDC exports with otlp (or none); an OpenTelemetry "
            "Collector takes OTLP and forwards it to any other backend",
            key="OTEL_TRACES_EXPORTER",
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http: "
            "pip install 'outbox-cdc[otel]', or set OTEL_TRACES_EXPORTER=none",
            key="OTEL_TRACES_EXPORTER",
        ) from None
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter
