"""One trace from the request that wrote the outbox row to the consumer's business effect (issue 40, item 5):
a service span around `emit()` in the application's transaction, `cdc run` in both delivery modes, the
idempotent consumer with a handler that writes a row and makes a span of its own; Jaeger's query API then
holds one trace: the service's span, the relay's `send` span below it, the consumer's `process` span below
that, and the handler's span below that. And with the collector gone, every event is delivered and the
spans are dropped and counted."""

from __future__ import annotations

import os
import re
import threading
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import NewTopic
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cdc.avro.deserialize import EventDeserializer
from cdc.avro.store import SchemaStore
from cdc.consumer import IdempotentConsumer
from cdc.consumer.processed import apply_setup
from cdc.outbox import emit
from tests.integration.stream.test_pipeline import decode_value
from tests.integration.test_metrics import get
from tests.plugins.jaeger import query
from tests.plugins.pipeline import SCHEMAS_DIR, Outbox, free_port, order_placed, wait_until
from tests.traces import continues

pytestmark = pytest.mark.integration

SERVICE = "cdc-e2e-shop"
CONSUMER = "cdc-e2e-invoices"


def provider(service: str) -> TracerProvider:
    exporter = OTLPSpanExporter(endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces")
    made = TracerProvider(resource=Resource({SERVICE_NAME: service}))
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


@pytest.fixture(scope="module")
def consumer_provider(jaeger_url: str) -> TracerProvider:
    """The invoice service's OpenTelemetry set-up: the global provider, as a service would install it (once
    per process)."""
    made = provider(CONSUMER)
    trace.set_tracer_provider(made)
    return made


def one_trace(jaeger_url: str, trace_id: str, *, spans: int) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def complete() -> bool:
        nonlocal found
        try:
            data = query(jaeger_url, f"/api/traces/{trace_id}")["data"]
        except OSError:
            return False
        found = data[0] if data else {}
        return len(found.get("spans", [])) >= spans

    wait_until(complete, 60, f"Jaeger to hold the {spans} spans of trace {trace_id}")
    return found


def by_name(found: dict[str, Any], prefix: str) -> dict[str, Any]:
    matches = [s for s in found["spans"] if s["operationName"].startswith(prefix)]
    assert len(matches) == 1, [s["operationName"] for s in found["spans"]]
    return matches[0]


def parent_of(span: dict[str, Any]) -> str:
    return next(r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF")


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span["tags"]}


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_one_trace_from_the_request_to_the_consumers_effect(
    outbox: Outbox,
    pipeline_process,
    jaeger_url,
    consumer_provider,
    unique_name,
    kafka_bootstrap,
    kafka_admin,
    delivery,
):
    topic = outbox.topic("order")
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    shop = provider(SERVICE).get_tracer("shop")
    store = SchemaStore(SCHEMAS_DIR)
    with psycopg.connect(outbox.dsn) as conn, shop.start_as_current_span("POST /orders") as request:
        event_id = emit(
            conn,
            aggregate_type="order",
            aggregate_id="trace-1",
            event_type="OrderPlaced",
            payload=order_placed("o-trace"),
            schemas=store,
            table=outbox.settings.table,
            columns=outbox.settings.columns,
        )
        conn.commit()
    trace_id = f"{request.get_span_context().trace_id:032x}"

    relay = pipeline_process(
        CDC_DELIVERY=delivery,
        CDC_CHECKPOINT_TOPIC=checkpoints,
        OTEL_SERVICE_NAME="cdc-e2e-relay",
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    relay.wait_streaming()

    invoices = unique_name("invoices")
    with psycopg.connect(outbox.dsn, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE TABLE {} (order_id text)").format(psycopg.sql.Identifier(invoices))
        )
    apply_setup(outbox.dsn)
    handled = threading.Event()
    handler_tracer = trace.get_tracer("invoice-handler")

    def create_invoice(conn: psycopg.Connection[Any], event) -> None:
        with handler_tracer.start_as_current_span("INSERT invoice"):
            conn.execute(
                psycopg.sql.SQL("INSERT INTO {} VALUES (%s)").format(psycopg.sql.Identifier(invoices)),
                (event.payload["order_id"],),
            )
        handled.set()

    dlq = unique_name("invoices-dlq")
    outbox.topics.append(dlq)
    kafka_admin.create_topics([NewTopic(dlq, num_partitions=1, replication_factor=1)])[dlq].result(timeout=30)
    consumer = IdempotentConsumer(
        name=unique_name("invoice-service"),
        dlq_topic=dlq,
        topics=[topic],
        handler=create_invoice,
        database_url=outbox.dsn,
        bootstrap_servers=kafka_bootstrap,
        deserializer=EventDeserializer(SCHEMAS_DIR),
        kafka_config={"auto.offset.reset": "earliest"},
    )
    running = threading.Thread(target=consumer.run, daemon=True)
    running.start()
    try:
        assert handled.wait(60), "the consumer never handled the event"
    finally:
        consumer.request_stop()
        running.join(30)
    assert relay.terminate() == 0, relay.tail()

    found = one_trace(jaeger_url, trace_id, spans=4)
    root = by_name(found, "POST /orders")
    send = by_name(found, f"send {topic}")
    process = by_name(found, f"process {topic}")
    effect = by_name(found, "INSERT invoice")
    assert parent_of(send) == root["spanID"], "the relay's span is the request's child"
    assert parent_of(process) == send["spanID"], "the consumer's span is the relay's child"
    assert parent_of(effect) == process["spanID"], "the handler's own span joins the trace"
    sent = tags(send)
    assert sent["span.kind"] == "producer" and sent["messaging.system"] == "kafka"
    assert sent["messaging.destination.name"] == topic and sent["messaging.message.id"] == str(event_id)
    assert sent["messaging.kafka.message.key"] == "trace-1" and sent["cdc.event_type"] == "OrderPlaced"
    assert "messaging.kafka.offset" in sent and "messaging.destination.partition.id" in sent
    assert sent["cdc.schema_version"] == 1 and "/" in sent["cdc.commit_lsn"]
    got = tags(process)
    assert got["span.kind"] == "consumer" and got["messaging.message.id"] == str(event_id)
    assert got["cdc.duplicate"] is False
    services = {p["serviceName"] for p in found["processes"].values()}
    assert services == {SERVICE, "cdc-e2e-relay", CONSUMER}


def test_with_the_collector_gone_every_event_is_delivered_and_the_spans_are_dropped_and_counted(
    outbox: Outbox, pipeline_process, consume
):
    port = free_port()
    proc = pipeline_process(
        CDC_METRICS_PORT=str(port),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",  # nobody listens
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_EXPORTER_OTLP_TIMEOUT="1000",
    )
    proc.wait_streaming()
    parent = f"00-{uuid.uuid4().hex}-00f067aa0ba902b7-01"
    txn = outbox.commit([outbox.event(f"k-{i % 3}", headers={"traceparent": parent}) for i in range(50)])
    records = consume(outbox.topic("order"), 50, timeout=60)
    assert {r.headers["id"].decode() for r in records} == set(txn.ids)
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 60, "the slot confirmed the events")

    def lost() -> float:
        text = get(port, "/metrics")[1]
        pattern = r'^cdc_tracing_spans_dropped_total\{reason="(?:export_failed|queue_full)"\} (\S+)$'
        return sum(float(value) for value in re.findall(pattern, text, re.M))

    wait_until(lambda: lost() >= 50, 60, "the 50 spans counted as dropped")
    assert proc.terminate() == 0, proc.tail()


def test_an_unsampled_or_invalid_context_passes_as_it_came_and_a_sampled_one_is_continued(
    outbox: Outbox, pipeline_process, consume
):
    """What the relay's per-row test decides (cdc.stream.emit, then RelaySpans.start), through `cdc run`:
    the record's headers are the row's when no span is made, and the send span's when one is."""
    proc = pipeline_process(OTEL_TRACES_EXPORTER="none")
    proc.wait_streaming()
    trace_id = uuid.uuid4().hex
    unsampled = f"00-{trace_id}-00f067aa0ba902b7-00"
    sampled = f"00-{trace_id}-00f067aa0ba902b7-01"
    rows = {
        "unsampled": {"traceparent": unsampled},
        "unsampled-state": {"traceparent": unsampled, "tracestate": "vendor=a1"},
        "flags-02": {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-02"},  # random, not sampled
        "upper-case": {"traceparent": sampled.upper()},  # not a valid traceparent: ignored
        "sampled-state": {"traceparent": sampled, "tracestate": "vendor=a1"},
        "sampled-03": {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-03"},
    }
    txn = outbox.commit([outbox.event(name, headers=headers) for name, headers in rows.items()])
    records = consume(outbox.topic("order"), len(rows), timeout=60)
    assert {r.headers["id"].decode() for r in records} == set(txn.ids)
    store = SchemaStore(SCHEMAS_DIR)
    for record in records:
        name = record.key.decode()
        row, got = rows[name], record.headers
        assert decode_value(store, record.value)[:2] == ("OrderPlaced", 1), f"{name}: the event's own value"
        if name.startswith("sampled"):
            assert continues(got["traceparent"], row["traceparent"]), (name, got["traceparent"])
            assert got["traceparent"].decode() != row["traceparent"], f"{name}: the send span's own context"
        else:
            assert got["traceparent"] == row["traceparent"].encode(), f"{name}: passed as it came"
        if "tracestate" in row:
            assert got["tracestate"] == row["tracestate"].encode()
    assert proc.terminate() == 0, proc.tail()
