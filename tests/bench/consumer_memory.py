"""`python -m tests.bench.consumer_memory`: the idempotent consumer's memory when it is far behind its topic.

A consumer behind its topic keeps librdkafka's queue of fetched records full, so its memory is what that queue
may hold. One run, on the local stack: ``--events`` OrderPlaced records are produced to a fresh topic of 6
partitions the way `cdc run` writes them (lz4, batches of up to 1 MB), then IdempotentConsumer with a handler
that inserts one invoice row reads it, each time in a process of its own and a consumer group of its own,
for ``--seconds`` after its first record, alternating two settings ``--repeat`` times:

- ``defaults``: `cdc.consumer`'s (at most 10,000 records queued, 256 KiB fetched per partition);
- ``before``: librdkafka's 100,000 records and 1 MiB per partition, as the consumer had them before.

Prints each process's peak RSS (VmHWM), its median RSS from 20 s after its first record on, and the events
per second it handled from its first record on; cleans up its topic, groups and tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from cdc.config import TableRef
from cdc.consumer import Event, EventDeserializer, IdempotentConsumer
from tests.bench.consumer import SCHEMAS, invoice_insert, produce, scratch
from tests.children import crash_dumps, dying_with_parent
from tests.kafka_admin import delete_groups

SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "before": {"queued.min.messages": 100_000, "max.partition.fetch.bytes": 1024 * 1024},
}
STEADY_AFTER = 20.0  # seconds after the first record: the queue has filled by then
# As cdc run's producer writes a backlog: lz4, batches of up to 1 MB.
PIPELINE_LIKE = {
    "compression.type": "lz4",
    "linger.ms": 10,
    "batch.num.messages": 10_000,
    "batch.size": 1_000_000,
}


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:"))


def child(
    topic: str, schema: str, group: str, seconds: float, events: int, kafka_config: dict[str, Any]
) -> None:
    """One consumer process: reads for ``seconds`` after its first record (or until it has read ``events``),
    then prints its figures as JSON."""
    dsn = os.environ["CDC_DATABASE_URL"]
    insert = invoice_insert(schema)

    def handler(conn: psycopg.Connection[Any], event: Event) -> None:
        conn.execute(insert, (event.payload["order_id"], event.payload["amount_cents"]))

    consumer = IdempotentConsumer(
        name=group,
        topics=[topic],
        handler=handler,
        database_url=dsn,
        bootstrap_servers=os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"],
        deserializer=EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 1}),
        processed_table=TableRef(schema=schema, name="processed_events"),
        dlq_topic=f"bench-{topic}.dlq",  # made by scratch()
        kafka_config=kafka_config,
    )
    samples: list[tuple[float, int, int]] = []  # (seconds since the first record, VmRSS kB, processed)

    def sample() -> None:
        first = None
        while True:
            done = consumer.counts["processed"]
            if done and first is None:
                first = time.monotonic()
            if first is not None:
                samples.append((time.monotonic() - first, status_kb("VmRSS"), done))
                if samples[-1][0] >= seconds or done >= events:
                    consumer.request_stop()
                    return
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    consumer.run()
    steady = [s for s in samples if s[0] >= STEADY_AFTER] or samples[-1:]
    figures = {
        "peak_mb": round(status_kb("VmHWM") / 1024, 1),
        "steady_mb": round(statistics.median(s[1] for s in steady) / 1024, 1),
        "events_per_s": round(samples[-1][2] / samples[-1][0]),  # from the first record on
    }
    print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.consumer_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--events", type=int, default=2_500_000)
    parser.add_argument("--seconds", type=float, default=45.0, help="each consumer's reading time")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--child", nargs=4, metavar=("TOPIC", "SCHEMA", "GROUP", "SETTING"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    crash_dumps()
    if args.child:
        topic, schema, group, setting = args.child
        child(topic, schema, group, args.seconds, args.events, SETTINGS[setting])
        return
    if args.seconds <= STEADY_AFTER:
        parser.error(f"--seconds must be over {STEADY_AFTER:g}: the steady state is measured after that")
    bootstrap, dsn = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"], os.environ["CDC_DATABASE_URL"]
    groups: list[str] = []
    with scratch(bootstrap, dsn, "consumer-memory", partitions=6) as (topic, schema):
        try:
            measure(bootstrap, dsn, topic, schema, args, groups)
        finally:
            if groups:  # a group that never committed may be gone already: deleted if it is there
                delete_groups(AdminClient({"bootstrap.servers": bootstrap}), groups)


def measure(
    bootstrap: str, dsn: str, topic: str, schema: str, args: argparse.Namespace, groups: list[str]
) -> None:
    """Fill the topic, then each setting in turn, ``--repeat`` times: one consumer process each."""
    produce(bootstrap, topic, args.events, PIPELINE_LIKE)
    print(f"events        {args.events:,} behind (6 partitions, lz4, as cdc run writes them)")
    for i in range(args.repeat):
        for setting in SETTINGS:
            with psycopg.connect(dsn, autocommit=True) as conn:  # every run handles the same records anew
                conn.execute(
                    sql.SQL("TRUNCATE {}, {}").format(
                        sql.Identifier(schema, "invoices"), sql.Identifier(schema, "processed_events")
                    )
                )
            groups.append(group := f"{topic}-{setting}-{i}")
            done = subprocess.run(
                dying_with_parent([sys.executable, "-m", "tests.bench.consumer_memory", "--seconds",
                 str(args.seconds), "--events", str(args.events), "--child", topic, schema, group, setting]),
                capture_output=True,
                text=True,
                timeout=args.seconds + 120,
                check=True,
            )  # fmt: skip
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            peak, steady, rate = figures["peak_mb"], figures["steady_mb"], figures["events_per_s"]
            print(
                f"{setting:13} peak RSS {peak:6.1f} MB, steady {steady:6.1f} MB, {rate:,} events/s "
                f"({SETTINGS[setting] or 'cdc.consumer defaults'})",
                flush=True,
            )


if __name__ == "__main__":
    main()
