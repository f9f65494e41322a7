"""End to end in one process, on a live slot: read CopyData -> decode -> route -> encode -> produce (idempotent,
to the local broker) -> every delivery report served. Three slots get the same 20 000 outbox rows (the bench's
OrderPlaced v1 payloads, 1 000 rows per transaction); then

* python-read: ReplicationSource.read() alone (the floor of the Python loop);
* python: ReplicationSource.read() + the reference path + Producer.produce() per event + poll(0) per batch;
* rust: FastPath.read_produce() on the same psycopg connection (PQgetCopyData through psycopg's libpq),
  rd_kafka_produceva on confluent-kafka's librdkafka, delivery reports aggregated per transaction.

    . .stack/env && .venv/bin/python -m prototypes.compiled_loop.capture   # the table and the publication
    . .stack/env && .venv/bin/python -m prototypes.compiled_loop.loop_bench --events 20000

CPU: getrusage(RUSAGE_SELF) (every thread of this process, librdkafka's included; not the walsender nor the
broker) and time.thread_time (the loop's thread), from START_REPLICATION to the last delivery report.
"""

from __future__ import annotations

import argparse
import os

import psycopg
from confluent_kafka import Producer

from cdc.stream.pgoutput import decode_copy_data
from cdc.stream.source import ReplicationSource
from prototypes.compiled_loop.fastpath import Glue
from prototypes.compiled_loop.produce_bench import Counter, conf, cpu
from prototypes.compiled_loop.reference import Reference

SLOTS = ("proto15e_read", "proto15e_py", "proto15e_rs", "proto15e_rsread")


def prepare(dsn: str, events: int, rows_per_txn: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE public.outbox")
        for slot in SLOTS:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (slot,))
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL bench_fill(%s, %s, %s, 500)", (10_000_000, events // rows_per_txn, rows_per_txn))


def drop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in SLOTS:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (slot,))


def python_read(dsn: str, events: int):
    source = ReplicationSource(dsn, slot=SLOTS[0], publication="proto15e")
    t0 = cpu()
    source.start()
    seen = 0
    while seen < events:
        for data in source.read(0.2):
            if data[0] == 0x77 and data[25] == 0x49:
                seen += 1
    t1 = cpu()
    source.close()
    return t1, t0, seen


def python_loop(dsn: str, events: int):
    ref = Reference()
    producer = Producer(conf())
    producer.list_topics(timeout=10)
    counter = Counter()
    produce, poll = producer.produce, producer.poll
    source = ReplicationSource(dsn, slot=SLOTS[1], publication="proto15e")
    t0 = cpu()
    source.start()
    done = 0
    while done < events:
        for data in source.read(0.2):
            if data[0] == 0x77:
                if data[25] == 0x49:
                    e = ref.event(data)
                    if e is not None:
                        topic, key, value, headers, ts = e
                        while True:
                            try:
                                produce(topic, value, key, headers=headers, timestamp=ts,
                                        on_delivery=counter.delivered)
                                break
                            except BufferError:
                                poll(0.05)
                        done += 1
                else:
                    ref.other(data)
            else:
                decode_copy_data(data)
        poll(0)
    while len(producer):
        poll(0.1)
    t1 = cpu()
    source.close()
    assert counter.ok == events, (counter.ok, counter.failed)
    return t1, t0, counter.ok


def rust_read(dsn: str, events: int):
    return rust_loop(dsn, events, produce=False)


def rust_loop(dsn: str, events: int, produce: bool = True):
    glue = Glue(Reference())
    if produce:
        glue.attach_producer(conf())
    libpq = next(line.split()[-1] for line in open("/proc/self/maps") if "/libpq" in line)
    source = ReplicationSource(dsn, slot=SLOTS[2 if produce else 3], publication="proto15e")
    fp = glue.fp
    acked = failed = 0
    t0 = cpu()
    source.start()
    ptr = source._pgconn.pgconn_ptr
    done = 0
    while done < events:
        n, handed, ended = fp.read_produce(libpq, ptr, 500, 200)
        done += n
        for data in handed:
            if data[0] != 0x77:
                decode_copy_data(data)
            elif data[25] == 0x49:  # a fallback: the reference checks it, then the compiled path takes its route
                glue.ref.event(data)
                glue._learn(data)
                if produce:
                    items, _ = fp.process_produce([data])
                    assert not items
                done += 1
            else:
                glue._other(data)
        assert not ended
        if not produce:
            continue
        a, f, _ = fp.poll(0)
        acked += sum(a.values())
        failed += len(f)
    while produce:
        a, f, q = fp.poll(100)
        acked += sum(a.values())
        failed += len(f)
        if q == 0:
            break
    t1 = cpu()
    source.close()
    fp.close()
    if not produce:
        return t1, t0, done
    assert acked == events and not failed, (acked, failed)
    return t1, t0, acked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--rows-per-txn", type=int, default=1000)
    args = ap.parse_args()
    dsn = os.environ["CDC_DATABASE_URL"]
    prepare(dsn, args.events, args.rows_per_txn)
    try:
        for name, fn in (
            ("python-read", python_read),
            ("python", python_loop),
            ("rust-read", rust_read),
            ("rust", rust_loop),
        ):
            t1, t0, n = fn(dsn, args.events)
            print(f"{name:12s} ({args.rows_per_txn} rows/txn) {(t1[0] - t0[0]) / n * 1e6:6.2f} µs/event process CPU, "
                  f"{(t1[1] - t0[1]) / n * 1e6:6.2f} loop thread, {n} events in {t1[2] - t0[2]:.2f} s")
    finally:
        drop(dsn)


if __name__ == "__main__":
    main()
