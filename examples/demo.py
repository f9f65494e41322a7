"""`make demo`: the pipeline end to end on the local stack.

Sets up a demo slot and publication, starts `cdc run`, writes a few business transactions that each insert
outbox rows (one with an invalid payload, one rolled back), then prints what arrived in Kafka, decoded from
Avro, and what went to the dead-letter topic. Stops the pipeline and removes the demo's slot and publication
so nothing keeps pinning WAL. Run with `. .stack/env` sourced (the Makefile does it).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fastavro
import orjson
import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from cdc.avro.store import SchemaStore
from cdc.config_loader import load_settings
from cdc.ops.setup import apply
from cdc.ops.status import teardown
from cdc.stream.admin import ask

ROOT = Path(__file__).resolve().parent.parent
RUN = uuid.uuid4().hex[:6]
SETTINGS = {
    "slot": "cdc_demo",
    "publication": "cdc_demo",
    "table": "public.outbox",
    "topic_template": f"demo.{RUN}.{{aggregate_type}}",
    "dlq_topic": f"demo.{RUN}.dlq",
    "schemas_dir": str(ROOT / "schemas"),
    "status_interval": "1",
}

ORDER = {
    "order_id": "o-1001",
    "customer_id": "c-42",
    "amount_cents": 2599,
    "currency": "EUR",
    "items": [{"sku": "book-1", "quantity": 1}, {"sku": "pen-3", "quantity": 2}],
}
EVENTS = [  # (aggregate_type, aggregate_id, event_type, version, payload)
    (
        "customer",
        "c-42",
        "CustomerRegistered",
        1,
        {"customer_id": "c-42", "email": "ada@example.org", "marketing_opt_in": False},
    ),
    ("order", "o-1001", "OrderPlaced", 1, ORDER),
    ("order", "o-1002", "OrderPlaced", 2, {**ORDER, "order_id": "o-1002", "coupon": "WELCOME10"}),
    (
        "order",
        "o-1001",
        "OrderShipped",
        1,
        {"order_id": "o-1001", "carrier": "DHL", "shipped_at": int(time.time() * 1000)},
    ),
    ("order", "o-1003", "OrderPlaced", 1, {**ORDER, "order_id": "o-1003", "amount_cents": "a lot"}),
]


def say(text: str) -> None:
    print(f"\033[1m== {text}\033[0m", flush=True)


def insert(
    conn: psycopg.Connection[object], events: list[tuple[str, str, str, int, dict[str, object]]]
) -> list[tuple[str, str]]:
    """The rows, each with a W3C trace context of its own, as a traced request would write it; returns
    (event type and aggregate, trace id) of each."""
    traces = []
    with conn.cursor() as cur:
        for aggregate_type, aggregate_id, event_type, version, payload in events:
            trace_id = uuid.uuid4().hex
            traces.append((f"{event_type} {aggregate_id}", trace_id))
            cur.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload,"
                " headers) VALUES (gen_random_uuid(), %s, %s, %s, %s, %s::jsonb, %s::jsonb)",
                (
                    aggregate_type,
                    aggregate_id,
                    event_type,
                    version,
                    orjson.dumps(payload).decode(),
                    orjson.dumps({"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"}).decode(),
                ),
            )
    return traces


def consume(topics: list[str], expected: int, timeout: float = 30) -> list[object]:
    consumer = Consumer(
        {
            "bootstrap.servers": os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"],
            "group.id": f"demo-{RUN}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # the pipeline creates the topics while we wait: notice them quickly
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe(topics)
    records: list[object] = []
    seen: set[tuple[str, int, int]] = set()  # a rebalance re-reads uncommitted partitions: show each once
    deadline = time.monotonic() + timeout
    while len(records) < expected and time.monotonic() < deadline:
        for msg in consumer.consume(100, timeout=0.5):
            if msg.error() is None and (msg.topic(), msg.partition(), msg.offset()) not in seen:
                seen.add((msg.topic(), msg.partition(), msg.offset()))
                records.append(msg)
    consumer.close()
    return records


def main() -> int:
    environ = {**os.environ, **{f"CDC_{k.upper()}": v for k, v in SETTINGS.items()}}
    settings = load_settings(config_file=None, environ=environ, overrides={})
    # The demo's slot is its own: what an interrupted run left (the slot, its saved position) goes first,
    # else `cdc setup` would rightly refuse to make a new slot where one that streamed was lost.
    teardown(settings)
    say("cdc setup (table, publication, slot)")
    for name, outcome in apply(settings):
        print(f"  {name}: {outcome}")

    say("starting `cdc run`")
    pipeline = subprocess.Popen([sys.executable, "-m", "cdc", "run"], env=environ)
    try:
        time.sleep(3)
        say("the application commits business transactions with outbox rows")
        with psycopg.connect(settings.database_url) as conn:
            traces = insert(conn, EVENTS[:2])
            conn.commit()
            traces += insert(conn, EVENTS[2:])
            conn.commit()
            insert(conn, [("order", "o-9999", "OrderPlaced", 1, {**ORDER, "order_id": "o-9999"})])
            conn.rollback()
        print("  5 events committed (one of them invalid), 1 rolled back")

        store = SchemaStore(settings.schemas_dir)
        say("what arrived in Kafka, decoded from Avro")
        for msg in consume([f"demo.{RUN}.customer", f"demo.{RUN}.order"], expected=4):
            value = msg.value()  # type: ignore[attr-defined]
            event_type, version = store.by_fingerprint(value[2:10])
            body = fastavro.schemaless_reader(io.BytesIO(value[10:]), store.get(event_type, version).parsed)
            headers = dict(msg.headers())  # type: ignore[attr-defined]
            print(
                f"  {msg.topic()} key={msg.key().decode()} {event_type} v{version} "  # type: ignore[attr-defined]
                f"commit_lsn={headers['commit_lsn'].decode()}\n    {body}"
            )

        jaeger = os.environ.get("CDC_STACK_JAEGER_URL")
        if jaeger:
            say("each event's trace: the relay's `send` span, from the commit to Kafka (Jaeger)")
            for what, trace_id in traces:
                print(f"  {what}: {jaeger}/trace/{trace_id}")
        else:
            print("  (CDC_STACK_TRACING=1 make demo starts Jaeger too, and prints each event's trace)")

        say("what went to the dead-letter topic")
        for msg in consume([f"demo.{RUN}.dlq"], expected=1):
            headers = dict(msg.headers())  # type: ignore[attr-defined]
            print(
                f"  id={headers['id'].decode()} reason={headers['error_reason'].decode()}\n"
                f"    {headers['error_message'].decode()}"
            )
    finally:
        say("stopping the pipeline (SIGTERM)")
        pipeline.send_signal(signal.SIGTERM)
        code = pipeline.wait(60)
        print(f"  cdc run exited with {code}")
        teardown(settings)  # `cdc teardown`: the slot, its saved position and the publication
        admin = AdminClient({"bootstrap.servers": os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]})

        def delete(left: float) -> list[str]:  # asked again while a broker just started settles
            names = [
                t for t in admin.list_topics(timeout=min(left, 10)).topics if t.startswith(f"demo.{RUN}.")
            ]
            for future in admin.delete_topics(names).values() if names else ():
                future.result(timeout=left)
            return names

        topics = ask(delete, what="delete the demo's topics", bound=60)
        print(f"  dropped the demo slot and publication, and its {len(topics)} topics")
    return code


if __name__ == "__main__":
    sys.exit(main())
