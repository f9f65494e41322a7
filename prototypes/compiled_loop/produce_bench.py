"""Producing to the local broker: confluent-kafka's Producer.produce() per event (the pipeline's path) beside
the prototype's rd_kafka_produceva from Rust on the same librdkafka, same configuration (cdc's
producer_config: idempotence, acks=all, lz4, linger 10 ms, one request in flight, gapless), same records.

    . .stack/env && .venv/bin/python -m prototypes.compiled_loop.produce_bench [--passes 2]

CPU is getrusage(RUSAGE_SELF) (every thread of the process: librdkafka's included) and time.thread_time (the
calling thread alone), from the first produce to the last delivery report.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc.config import KafkaSettings, Settings
from cdc.stream.sink import producer_config
from prototypes.compiled_loop.fastpath import Glue
from prototypes.compiled_loop.reference import Reference, load_inputs

HERE = Path(__file__).parent


def cpu() -> tuple[float, float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, time.thread_time(), time.monotonic()


def conf() -> dict:
    s = Settings(database_url="postgresql://unused",
                 kafka=KafkaSettings(bootstrap_servers=os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]))
    return producer_config(s)


class Counter:
    """The shape of checkpoint.Transaction.delivered: one Python call per delivery report."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0

    def delivered(self, err, msg=None) -> None:
        if err is None and msg is not None and msg.offset() is not None:
            self.ok += 1
        else:
            self.failed += 1


def python_path(events, batches_of: int) -> tuple[float, float, float, int]:
    p = Producer(conf())
    p.list_topics(timeout=10)
    c = Counter()
    produce, poll = p.produce, p.poll
    t0 = cpu()
    for i, (topic, key, value, headers, ts) in enumerate(events):
        try:
            produce(topic, value, key, headers=headers, timestamp=ts, on_delivery=c.delivered)
        except BufferError:
            poll(0.05)
            produce(topic, value, key, headers=headers, timestamp=ts, on_delivery=c.delivered)
        if i % batches_of == batches_of - 1:
            poll(0)
    while len(p):
        poll(0.1)
    t1 = cpu()
    assert c.ok == len(events), (c.ok, c.failed)
    return t1[0] - t0[0], t1[1] - t0[1], t1[2] - t0[2], c.ok


def rust_path(messages, batches_of: int) -> tuple[float, float, float, int, str, float]:
    glue = Glue(Reference())
    version = glue.attach_producer(conf())
    batches = [messages[i : i + batches_of] for i in range(0, len(messages), batches_of)]
    glue.run(batches[0], produce=False)  # learn the routes (a first batch falls back to Python)
    for b in batches:  # and once more so that every route is in the compiled path
        glue.run(b[:2] + [m for m in b if m[25] == 0x49][:1], produce=False)
    acked = failed = 0
    t0 = cpu()
    fallbacks0 = glue.fallbacks
    for b in batches:
        glue.run(b, produce=True)
        a, f, _ = glue.fp.poll(0)
        acked += sum(a.values())
        failed += len(f)
    while True:
        a, f, q = glue.fp.poll(100)
        acked += sum(a.values())
        failed += len(f)
        if q == 0:
            break
    t1 = cpu()
    assert failed == 0 and glue.fallbacks == fallbacks0, (failed, glue.fallbacks - fallbacks0)
    glue.fp.close()
    return t1[0] - t0[0], t1[1] - t0[1], t1[2] - t0[2], acked, version, 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--alone", action="store_true", help="only librdkafka alone")
    args = ap.parse_args()
    if args.alone:
        return librdkafka_alone()
    messages = load_inputs(HERE / "inputs.bin")
    events = Reference().run(messages)
    admin = AdminClient({"bootstrap.servers": os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]})
    topics = sorted({e[0] for e in events})
    for f in admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1) for t in topics]).values():
        try:
            f.result()
        except Exception:
            pass
    n = len(events)
    for k in range(args.passes):
        proc, thread, wall, ok = python_path(events, 500)
        print(f"pass {k} python produce()+callbacks: {proc / n * 1e6:6.2f} µs/event process CPU, "
              f"{thread / n * 1e6:6.2f} main thread, {ok} acked in {wall:.2f} s")
        proc, thread, wall, ok, version, _ = rust_path(messages, 500)
        print(f"pass {k} rust decode+encode+produceva:  {proc / n * 1e6:6.2f} µs/event process CPU, "
              f"{thread / n * 1e6:6.2f} main thread, {ok} acked in {wall:.2f} s (librdkafka {version})")


def librdkafka_alone(n: int = 20_000) -> None:
    """rd_kafka_produceva of one ~330-byte record, with 6 headers and with none: librdkafka's own cost."""
    from cdc_fastpath import FastPath

    from prototypes.compiled_loop.fastpath import loaded_librdkafka

    events = Reference().run(load_inputs(HERE / "inputs.bin"))
    topic, key, value, _, _ = events[0]
    for headers in (6, 0, 6, 0):
        fp = FastPath()
        fp.attach_producer(loaded_librdkafka(), [(k, str(v).lower() if isinstance(v, bool) else str(v))
                                                 for k, v in conf().items()])
        fp.add_route(b"a", b"e", b"1", b"", ("null",), topic)
        fp.produce_same(100, 0, key, value, headers)  # connected, producer id acquired
        fp.flush(10_000)
        fp.poll(0)
        t0 = cpu()
        fp.produce_same(n, 0, key, value, headers)
        acked = 0
        while True:
            a, f, q = fp.poll(100)
            acked += sum(a.values())
            if q == 0:
                break
        t1 = cpu()
        fp.close()
        print(f"librdkafka alone, {headers} headers: {(t1[0] - t0[0]) / n * 1e6:6.2f} µs/event process CPU, "
              f"{(t1[1] - t0[1]) / n * 1e6:6.2f} calling thread ({acked} acked)")


if __name__ == "__main__":
    main()
