"""OpenTelemetry through the outbox, on the real stack (issue 40): the context emit() writes into the row, the
Debezium column read into the record, the SDK's export to the stack's Jaeger found through its query API, and
a collector that is gone or frozen: spans dropped and counted, nothing blocked."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from psycopg import sql

from cdc import tracing
from cdc.avro.store import SchemaStore
from cdc.config_loader import load_settings
from cdc.ops import setup as cdc_setup
from cdc.outbox import emit
from cdc.trace_context import format_traceparent
from cdc.trace_processor import Tracing
from tests.plugins.jaeger import spans, traces_of
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed, wait_until

PARENT = TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def dropped() -> dict[str, int]:
    return dict(tracing.STATS.dropped)


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """OTEL_* variables of the test's own, none left from the process: what start() reads."""
    for name in (
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SERVICE_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def headers_of(outbox: Any, event_id: uuid.UUID) -> dict[str, str]:
    row = outbox.conn.execute(
        sql.SQL("SELECT headers FROM {} WHERE id = %s").format(sql.Identifier(outbox.table)), (event_id,)
    ).fetchone()
    return row[0] or {}


def test_emit_writes_the_active_spans_context_into_the_row_and_it_reaches_kafka(
    outbox, pipeline_process, consume
):
    store = SchemaStore(SCHEMAS_DIR)
    common = {"schemas": store, "table": outbox.settings.table, "columns": outbox.settings.columns}
    outbox.topic("order")
    tracer = TracerProvider().get_tracer("invoice-service")
    order = {"aggregate_type": "order", "event_type": "OrderPlaced", **common}
    with psycopg.connect(outbox.dsn) as conn:
        with tracer.start_as_current_span("POST /orders") as span:
            traced = emit(
                conn, aggregate_id="t-1", payload=order_placed("o-t1"), headers={"tenant": "acme"}, **order
            )
            own = emit(
                conn,
                aggregate_id="t-2",
                payload=order_placed("o-t2"),
                headers={"traceparent": PARENT},
                **order,
            )
        plain = emit(conn, aggregate_id="t-3", payload=order_placed("o-t3"), **order)
        conn.commit()
    ctx = span.get_span_context()
    expected = format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags)
    assert headers_of(outbox, traced) == {"tenant": "acme", "traceparent": expected}
    assert headers_of(outbox, own) == {"traceparent": TRACEPARENT}, "the caller's context is kept whole"
    assert headers_of(outbox, plain) == {}, "no span, no context"

    proc = pipeline_process()
    proc.wait_streaming()
    records = {r.headers["id"].decode(): r for r in consume(outbox.topic("order"), 3, timeout=30)}
    # The relay's `send` span (tracing = row-context-only, the default) is the row's context's child: the
    # record carries the same trace and flags, and the span's own id in place of the request's.
    for event_id, row_context in ((traced, expected), (own, TRACEPARENT)):
        version, trace_id, span_id, flags = records[str(event_id)].headers["traceparent"].decode().split("-")
        assert (version, trace_id, flags) == tuple(row_context.split("-")[i] for i in (0, 1, 3))
        assert span_id != row_context.split("-")[2] and len(span_id) == 16
    assert "traceparent" not in records[str(plain)].headers
    assert proc.terminate() == 0


@pytest.fixture
def debezium_outbox(outbox, unique_name) -> Iterator[dict[str, str]]:
    """A table in Debezium's layout (the ``debezium`` preset, as `cdc setup` makes it) plus Debezium's
    ``tracingspancontext`` column; the CDC_* variables of a pipeline that reads it."""
    env = {
        "CDC_COLUMNS": "debezium",
        "CDC_TABLE": "public." + unique_name("dbz")[:50],
        "CDC_SLOT": unique_name("slot")[:63],
        "CDC_PUBLICATION": unique_name("pub")[:63],
    }
    settings = load_settings(
        config_file=None,
        environ={},
        overrides={
            "database_url": outbox.dsn,
            "columns": "debezium",
            "table": env["CDC_TABLE"],
            "slot": env["CDC_SLOT"],
            "publication": env["CDC_PUBLICATION"],
        },
    )
    cdc_setup.apply(settings)
    table = sql.Identifier(settings.table.name)
    outbox.conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN tracingspancontext varchar(256)").format(table))
    try:
        yield env
    finally:
        outbox.conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = %s AND active_pid IS NOT NULL",
            (settings.slot,),
        )
        active = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL"
        released = lambda: outbox.conn.execute(active, (settings.slot,)).fetchone()[0] == 0  # noqa: E731
        wait_until(released, 10, "the slot to be released")
        outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot,))
        outbox.conn.execute(sql.SQL("DROP TABLE {}").format(table))


def test_the_debezium_preset_reads_the_tracingspancontext_column(
    outbox, debezium_outbox, pipeline_process, consume
):
    # What Debezium's Quarkus outbox extension writes: java.util.Properties.store() of the W3C propagator.
    properties = (
        f"#Thu Oct 30 10:15:02 UTC 2025\ntraceparent={TRACEPARENT}\ntracestate=rojo\\=00f067aa0ba902b7\n"
    )
    table = sql.Identifier(debezium_outbox["CDC_TABLE"].split(".", 1)[1])
    ids = [uuid.uuid4(), uuid.uuid4()]
    with psycopg.connect(outbox.dsn) as conn:
        for event_id, context in zip(ids, (properties, None), strict=True):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, tracingspancontext)"
                    " VALUES (%s, 'order', 'd-1', 'OrderPlaced', %s, %s)"
                ).format(table),
                (event_id, orjson.dumps(order_placed(f"o-{event_id}")).decode(), context),
            )
        conn.commit()
    outbox.topic("order")
    proc = pipeline_process(**debezium_outbox)
    proc.wait_streaming()
    records = {r.headers["id"].decode(): r for r in consume(outbox.topic("order"), 2, timeout=30)}
    # The relay's `send` span continues the column's trace: its id in place of the request's span id, the
    # same trace, flags and tracestate.
    version, trace_id, span_id, flags = records[str(ids[0])].headers["traceparent"].decode().split("-")
    assert [version, trace_id, flags] == [TRACEPARENT.split("-")[i] for i in (0, 1, 3)]
    assert span_id != TRACEPARENT.split("-")[2]
    assert records[str(ids[0])].headers["tracestate"] == b"rojo=00f067aa0ba902b7"
    assert "traceparent" not in records[str(ids[1])].headers
    assert proc.terminate() == 0


def test_a_span_is_exported_to_jaeger_and_found_through_its_query_api(jaeger_url, otel_env):
    service = f"cdc-test-{uuid.uuid4().hex[:8]}"
    trace_id = uuid.uuid4().int  # a trace of this run's own: Jaeger keeps the earlier runs'
    otel_env.setenv("OTEL_SERVICE_NAME", service)
    before = tracing.STATS.exported
    traced = tracing.start("always")
    assert traced is not None
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(
                trace_id,
                0x00F067AA0BA902B7,
                is_remote=True,
                trace_flags=trace.TraceFlags(1),
            )
        )
    )
    with traced.tracer.start_as_current_span(
        "send outbox.event.order", context=parent, kind=trace.SpanKind.PRODUCER
    ) as span:
        span.set_attribute("messaging.system", "kafka")
    traced.shutdown(timeout=15)
    assert tracing.STATS.exported == before + 1
    [found] = traces_of(jaeger_url, service)
    [(got, tags)] = list(spans(found))
    assert found["traceID"] == f"{trace_id:032x}"
    assert got["operationName"] == "send outbox.event.order"
    assert got["references"][0]["spanID"] == "00f067aa0ba902b7"
    assert tags["messaging.system"] == "kafka" and tags["span.kind"] == "producer"
    assert found["processes"][got["processID"]]["serviceName"] == service


class FrozenCollector:
    """A port that takes connections and never answers: a collector that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def end_spans(traced: Tracing, count: int) -> float:
    """End ``count`` sampled spans; the longest time one took, in seconds. Not a speed test: the bound the
    tests put on it (0.5 s) is thousands of times what ending a span costs, and a tenth of the export
    timeout that a span handed to a blocking exporter would wait."""
    worst = 0.0
    for _ in range(count):
        started = time.monotonic()
        traced.tracer.start_span("send outbox.event.order", kind=trace.SpanKind.PRODUCER).end()
        worst = max(worst, time.monotonic() - started)
    return worst


def test_a_collector_that_is_gone_loses_spans_counted_and_blocks_nothing(otel_env):
    with socket.socket() as probe:  # a port nobody listens on: connections refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    otel_env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "50")
    otel_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
    otel_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    before = dropped()
    traced = tracing.start("always")
    assert traced is not None
    worst = end_spans(traced, 30)
    wait_until(lambda: dropped()["export_failed"] - before["export_failed"] == 30, 20, "the failed exports")
    started = time.monotonic()
    traced.shutdown(timeout=5)
    assert time.monotonic() - started < 6
    assert worst < 0.5, f"ending a span took {worst:.3f} s"
    after = dropped()
    assert sum(after.values()) - sum(before.values()) == 30


def test_a_frozen_collector_fills_the_bounded_queue_and_the_rest_is_dropped(otel_env):
    collector = FrozenCollector()
    try:
        otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
        otel_env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
        otel_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
        otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
        before = dropped()
        traced = tracing.start("always")
        assert traced is not None
        worst = end_spans(traced, 1000)
        # One batch of 10 is stuck in the frozen export; 100 wait in the queue; the rest were dropped.
        lost = dropped()["queue_full"] - before["queue_full"]
        assert 1000 - 100 - 10 <= lost <= 1000 - 100, lost
        assert worst < 0.5, f"ending a span took {worst:.3f} s with the collector frozen"
        started = time.monotonic()
        done = threading.Event()
        threading.Thread(target=lambda: (traced.shutdown(timeout=2), done.set()), daemon=True).start()
        assert done.wait(10), "shutdown did not return"
        assert time.monotonic() - started < 4
        # The batch stuck in the export fails when its OTLP timeout ends: every span is then counted, once.
        wait_until(lambda: sum(dropped().values()) - sum(before.values()) == 1000, 15, "every span counted")
    finally:
        collector.close()
