"""`python -m tests.bench.consumer`: what exactly-once processing costs a downstream service.

In one run, on the local stack: ``--events`` OrderPlaced records (single-object Avro, as the pipeline writes
them) are produced to a fresh topic; then, side by side on the same records,

1. a plain consumer that only decodes each record with EventDeserializer (the ceiling), and
2. IdempotentConsumer with a handler that inserts one invoice row (guard rows and effects in batched
   transactions, each followed by an offset commit), its handlers in psycopg's pipeline mode,
3. the same without the pipeline (a round trip per handler statement),
4. IdempotentConsumer with a batch handler that inserts the batch's new events' invoice rows with one
   ``executemany`` (the guard rows and the effects still in one transaction per batch),
5. the same batch handler writing them with ``COPY``,

each timed from its first record to its last, with this process's CPU time (all its threads: librdkafka's too;
not PostgreSQL's) over the same span. Prints events/s, CPU µs per event and the ratio; cleans up its topic and
tables.
"""

from __future__ import annotations

import argparse
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import SchemaStore
from cdc.config import TableRef
from cdc.consumer import Event, EventDeserializer, IdempotentConsumer
from cdc.consumer.processed import apply_setup
from tests.bench.run import ROOT
from tests.children import crash_dumps
from tests.kafka_admin import create_topics, delete_topics
from tests.plugins.pipeline import order_placed

SCHEMAS = ROOT / "schemas"


def invoice_insert(schema: str) -> str:
    """The one-row handler's statement, as a service writes it: a str (a sql.Composed would be rendered again
    at every call, ~5 µs)."""
    return (
        sql.SQL("INSERT INTO {} (order_id, amount_cents) VALUES (%s, %s)")
        .format(sql.Identifier(schema, "invoices"))
        .as_string()
    )


@contextmanager
def scratch(bootstrap: str, dsn: str, name: str, *, partitions: int) -> Iterator[tuple[str, str]]:
    """``(topic, schema)`` of a run's own, with the topic's dead-letter topic (``bench-<topic>.dlq``), an
    ``invoices`` table and a ``processed_events`` table; all dropped afterwards."""
    run = secrets.token_hex(4)
    topic, schema = f"bench.{name}.{run}", f"bench_{name.replace('-', '_')}_{run}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    dlq = f"bench-{topic}.dlq"
    create_topics(
        admin,
        [NewTopic(topic, num_partitions=partitions, replication_factor=1), NewTopic(dlq, num_partitions=1)],
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (order_id text, amount_cents bigint)").format(
                sql.Identifier(schema, "invoices")
            )
        )
    apply_setup(dsn, TableRef(schema=schema, name="processed_events"))
    try:
        yield topic, schema
    finally:
        delete_topics(admin, [topic, dlq])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def produce(bootstrap: str, topic: str, n: int, config: dict[str, Any] | None = None) -> None:
    """``n`` OrderPlaced records as the pipeline writes them (``config``: more producer settings)."""
    encoder = AvroEncoder(SchemaStore(SCHEMAS))
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, **(config or {})}
    )
    for i in range(n):
        order = f"o-{i}"
        headers = [
            ("id", secrets.token_hex(16).encode()),
            ("event_type", b"OrderPlaced"),
            ("schema_version", b"1"),
        ]
        value = encoder.encode("OrderPlaced", 1, orjson.dumps(order_placed(order)))
        while True:
            try:
                producer.produce(topic, key=f"agg-{i % 500}", value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


@dataclass(frozen=True)
class Span:
    """One consumer's run over the records: wall-clock seconds and this process's CPU seconds."""

    seconds: float
    cpu: float

    def rate(self, n: int) -> str:
        return f"{n / self.seconds:,.0f} events/s, {self.cpu / n * 1e6:.1f} µs CPU/event"


def mark() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def between(first: tuple[float, float], last: tuple[float, float]) -> Span:
    return Span(last[0] - first[0], last[1] - first[1])


def plain(bootstrap: str, topic: str, n: int) -> Span:
    deserialize = EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 1})
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-plain-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    seen, start = 0, None
    try:
        while seen < n:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            start = start or mark()
            deserialize(message)
            seen += 1
        assert start is not None
        return between(start, mark())
    finally:
        consumer.close()


def idempotent(
    bootstrap: str,
    dsn: str,
    topic: str,
    n: int,
    schema: str,
    *,
    pipeline: bool,
    batch: str | None = None,
) -> Span:
    """From the first handler call to the last event processed; ``batch``: None (one event per handler
    call), "executemany" or "copy" (a batch handler writing that way)."""
    marks: list[tuple[float, float]] = []
    insert = invoice_insert(schema)
    copy_in = sql.SQL("COPY {} (order_id, amount_cents) FROM STDIN").format(
        sql.Identifier(schema, "invoices")
    )

    def handler(conn: psycopg.Connection[Any], event: Event) -> None:
        if not marks:
            marks.append(mark())
        conn.execute(insert, (event.payload["order_id"], event.payload["amount_cents"]))

    def batch_handler(conn: psycopg.Connection[Any], events: list[Event]) -> None:
        if not marks:
            marks.append(mark())
        if batch == "copy":
            with conn.cursor() as cur, cur.copy(copy_in) as copy:
                for e in events:
                    copy.write_row((e.payload["order_id"], e.payload["amount_cents"]))
            return
        with conn.cursor() as cur:
            cur.executemany(insert, [(e.payload["order_id"], e.payload["amount_cents"]) for e in events])

    consumer = IdempotentConsumer(
        name=f"bench-{topic}-{batch or ('pipeline' if pipeline else 'plain')}",
        topics=[topic],
        handler=None if batch else handler,
        batch_handler=batch_handler if batch else None,
        database_url=dsn,
        bootstrap_servers=bootstrap,
        deserializer=EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 1}),
        processed_table=TableRef(schema=schema, name="processed_events"),
        dlq_topic=f"bench-{topic}.dlq",
        pipeline=pipeline,
    )

    def watch() -> None:
        while consumer.counts["processed"] < n:
            time.sleep(0.05)
        marks.append(mark())
        consumer.request_stop()

    threading.Thread(target=watch, daemon=True).start()
    consumer.run()
    return between(marks[0], marks[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.consumer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    crash_dumps()
    bootstrap, dsn = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"], os.environ["CDC_DATABASE_URL"]
    with scratch(bootstrap, dsn, "consumer", partitions=3) as (topic, schema):
        produce(bootstrap, topic, args.events)
        base = plain(bootstrap, topic, args.events)
        guarded = idempotent(bootstrap, dsn, topic, args.events, schema, pipeline=True)
        unpiped = idempotent(bootstrap, dsn, topic, args.events, schema, pipeline=False)
        many = idempotent(bootstrap, dsn, topic, args.events, schema, pipeline=False, batch="executemany")
        copied = idempotent(bootstrap, dsn, topic, args.events, schema, pipeline=False, batch="copy")
        print(f"events        {args.events:,} (3 partitions, single-object Avro: 35 B values, 3 headers)")
        n = args.events
        print(f"plain decode  {base.rate(n)}")
        print(
            f"idempotent    {guarded.rate(n)} "
            "(guard rows and effects in batched transactions, then an offset commit each)"
        )
        print(f"  no pipeline {unpiped.rate(n)} (a round trip per handler statement)")
        print(
            f"batch handler {many.rate(n)} "
            "(the batch's new events in one executemany; guard rows and effects in one transaction)"
        )
        print(f"  with COPY   {copied.rate(n)} (the batch's new events in one COPY)")
        print(f"ratio         {base.seconds / guarded.seconds:.2f} (idempotent / plain decode)")
        print(
            f"batch ratios  {base.seconds / many.seconds:.2f} executemany, "
            f"{base.seconds / copied.seconds:.2f} COPY (of plain decode)"
        )


if __name__ == "__main__":
    main()
