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
(:class:`TracingCollector`, which :mod:`cdc.metrics` serves). ``Tracing.shutdown`` waits for the queue at
most as long as its caller says. The processor, its exporter and ``Tracing`` are :mod:`cdc.trace_processor`'s,
imported when tracing is on. The W3C context of rows and records is :mod:`cdc.trace_context`'s.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cdc.config import TRACING_MODES as MODES
from cdc.errors import ConfigError
from cdc.trace_stats import STATS, SpanStats, TracingCollector

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from cdc.trace_processor import Tracing


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing, or blocked
        return False


# Found, not imported: the SDK (about 4 MB and 40 modules) is loaded by start() only, when tracing is on.
SDK = _installed("opentelemetry.sdk.trace")

__all__ = ["MODES", "STATS", "SpanStats", "TracingCollector", "start"]

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


def start(mode: str, *, service_name: str = INSTRUMENTATION, compiled: bool = False) -> Tracing | None:
    """Set OpenTelemetry's SDK up from the ``OTEL_*`` environment for ``mode`` (the ``tracing`` setting), or
    None when tracing is off (said in the log). ``service_name`` is the default of ``OTEL_SERVICE_NAME``;
    ``compiled``: the relay's spans are written by the compiled extension (``fast_path``), when it has the
    writer.
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
    from opentelemetry.sdk.trace import TracerProvider

    from cdc import fastpath  # the extension is loaded for the writer only when tracing is on
    from cdc.trace_processor import BoundedProcessor, Tracing

    _check_environment()
    exporter = _exporter()
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    # Its sampler comes from OTEL_TRACES_SAMPLER and _ARG (parentbased_always_on by default: a row's sampled
    # flag decides). No exit hook: it would wait up to 30 s for a collector that is gone.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    send_span = getattr(fastpath.extension, "send_span", None) if compiled else None
    processor = BoundedProcessor(
        exporter, _int_env("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE), STATS, send_span=send_span
    )
    provider.add_span_processor(processor)
    log.info(
        "tracing: %s, service %s, exporting to %s, sampler %s",
        mode,
        resource.attributes.get(SERVICE_NAME),
        _shown(_endpoint()) if exporter is not None else "nowhere (OTEL_TRACES_EXPORTER=none)",
        os.environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on",
    )
    plain_child = getattr(fastpath.extension, "plain_child", None) if compiled else None
    return Tracing(mode, provider, processor, name=INSTRUMENTATION, plain_child=plain_child)


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
