"""cdc.tracing: the SDK set up from the OTEL_* environment, its refusals, its metrics, and life without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cdc import tracing
from cdc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")  # nothing leaves a unit test
    return monkeypatch


def test_off_and_disabled_make_nothing(clean_env):
    assert tracing.start("off") is None
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.start("always") is None


def test_an_unknown_mode_is_refused():
    with pytest.raises(ConfigError) as refused:
        tracing.start("sometimes")
    assert refused.value.key == "tracing"


def test_the_service_name_defaults_to_outbox_cdc_and_otel_service_name_wins(clean_env):
    started = tracing.start("row-context-only")
    assert started is not None and started.mode == "row-context-only"
    assert started.provider.resource.attributes["service.name"] == "outbox-cdc"
    started.shutdown(timeout=1)
    clean_env.setenv("OTEL_SERVICE_NAME", "billing-relay")
    started = tracing.start("always")
    assert started is not None
    assert started.provider.resource.attributes["service.name"] == "billing-relay"
    started.shutdown(timeout=1)


def test_the_sampler_follows_the_parent_and_otel_traces_sampler(clean_env):
    started = tracing.start("always")
    assert started is not None
    assert "ParentBased" in type(started.provider.sampler).__name__
    started.shutdown(timeout=1)
    clean_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.01")
    started = tracing.start("always")
    assert started is not None
    assert "0.01" in started.provider.sampler.get_description()
    started.shutdown(timeout=1)


@pytest.mark.parametrize(
    ("variables", "key"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1%"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),  # 512 > 100
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ],
)
def test_what_this_install_cannot_honour_is_refused_by_name(clean_env, variables, key):
    for name, value in variables.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        tracing.start("always")
    assert refused.value.key == key and key in str(refused.value)


def test_the_metrics_are_counters_and_a_gauge():
    stats = tracing.SpanStats()
    stats.dropped["queue_full"] = 3
    stats.exported = 7
    stats.queues.append(lambda: 2)  # a batch queue's count
    registry = CollectorRegistry(auto_describe=False)
    registry.register(tracing.TracingCollector(stats))
    text = generate_latest(registry).decode()
    assert 'cdc_tracing_spans_dropped_total{reason="queue_full"} 3.0' in text
    assert 'cdc_tracing_spans_dropped_total{reason="export_failed"} 0.0' in text
    assert "cdc_tracing_spans_exported_total 7.0" in text
    assert "cdc_tracing_queued_spans 2.0" in text


WITHOUT_OPENTELEMETRY = textwrap.dedent(
    """
    import logging, sys
    sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed: every import fails
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from cdc import tracing, trace_context
    from cdc.stream.route import parse_headers
    import cdc.outbox, cdc.metrics, cdc.cli
    assert not tracing.SDK
    assert tracing.start("always") is None
    assert trace_context.current_headers() == {}
    tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert trace_context.is_sampled(tp) and trace_context.remote_context(tp) is None
    assert parse_headers(b'{"traceparent": "' + tp + b'"}') == (("traceparent", tp),)
    print("ok")
    """
)


def test_without_opentelemetry_tracing_is_off_and_the_rest_works():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENTELEMETRY], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (
        "tracing is off: OpenTelemetry's SDK is not installed (pip install 'outbox-cdc[otel]')" in done.stdout
    )
    assert done.stdout.rstrip().endswith("ok")


def test_the_endpoints_credentials_and_query_never_reach_the_log(clean_env, caplog):
    """A collector's token goes in the endpoint's userinfo or query (or OTEL_EXPORTER_OTLP_HEADERS, never
    logged): the start's line names the endpoint without them."""
    clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    clean_env.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "https://relay:s3cret-token@otel.example.com:4318?key=k3y"
    )
    with caplog.at_level("INFO", logger="cdc.tracing"):
        started = tracing.start("row-context-only")
    assert started is not None
    started.shutdown(timeout=0.5)
    assert "exporting to https://otel.example.com:4318" in caplog.text
    assert "(its credentials and query not shown)" in caplog.text
    assert "s3cret" not in caplog.text and "k3y" not in caplog.text and "relay:" not in caplog.text


@pytest.mark.usefixtures("compiled_extension")
def test_the_relays_spans_are_written_by_the_extension_when_the_hot_path_is_compiled(clean_env):
    from cdc import fastpath

    clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached: nothing ends
    for compiled, writer in ((True, fastpath.extension.send_span), (False, None)):  # type: ignore[union-attr]
        started = tracing.start("row-context-only", compiled=compiled)
        assert started is not None
        assert started.processor.send_span is writer
        started.shutdown(1.0)
