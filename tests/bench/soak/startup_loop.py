"""The soak driver's start-up, over and over, to find the call that crashed librdkafka (issue 45).

    . .stack/env && python -m tests.bench.soak.startup_loop --starts 300
    python -m tests.bench.soak.startup_loop --starts 100 --fresh-broker   # a broker of its own per start

Each start makes the driver's own Kafka clients and calls, in its order and threads: an AdminClient in the
main thread creates the three topics (the event topic with 6 partitions, two dead-letter topics); a producer
and a committing consumer group (subprocesses: what `cdc run` and the invoice consumer do to the broker)
start; the latency consumer (tests.bench.soak.sampling.LatencyHistograms, a thread) assigns and polls; the
main thread then reads the topic's end offsets (ListOffsets) and the group's committed offsets (first for a
group that does not exist yet) every 0.5 s until the warm-up is consumed, takes a few samples, and cleans up
as Pipeline.cleanup does (DeleteTopics, ListConsumerGroups, DeleteConsumerGroups).

The committed offsets are read as the soak reads them now (a Consumer of the group); ``--admin-offsets``
reads them as it did when it crashed (AdminClient.list_consumer_group_offsets, see
tests/faults/offset_fetch_crash.py).

``--fresh-broker``: every start gets a broker started a moment before (new KRaft storage, ports 31092/31093
by default, as tests/faults/fresh_broker.py), so that the group coordinator is still being created, as on a
stack just started. A crash ends the loop: its exit status is -11 (SIGSEGV) and, for a crash in a Python
thread, faulthandler prints the Python stack (a crash in librdkafka's own threads leaves none; gdb does).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.bench.measure import Watermarks
from tests.bench.soak import PARTITIONS, ROOT, WARM_UP_ROWS
from tests.bench.soak.sampling import LatencyHistograms
from tests.children import crash_dumps, dying_with_parent
from tests.faults.offset_fetch_crash import admin_committed
from tests.kafka_admin import committed_offsets, create_topics, delete_groups, delete_topics_with_prefix

# What `cdc run` does to the broker at start: an idempotent producer writes the warm-up into the topic.
PRODUCER = """
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "enable.idempotence": True, "linger.ms": 10})
for i in range(int(sys.argv[3])):
    p.produce(sys.argv[2], str(i).encode(), str(i).encode())
sys.exit(1 if p.flush(60) else 0)
"""
# What the invoice consumer does: a group member that commits what it read, until it is stopped.
CONSUMER = """
import signal, sys
from confluent_kafka import Consumer
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "enable.auto.commit": False,
              "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
try:
    while True:
        batch = c.consume(500, 0.5)
        if batch:
            c.commit(asynchronous=False)
finally:
    c.close()
"""


def consumed(admin: AdminClient, reader: Consumer | None, group: str, topic: str) -> int:
    """tests.bench.soak.pipeline.Pipeline.consumed, now (``reader``, a Consumer of the group) or as it was
    when the soak crashed (``reader`` None: the admin API)."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    if reader is None:
        return sum(max(0, offset) for offset in admin_committed(admin, group, partitions))
    return sum(max(0, tp.offset) for tp in committed_offsets(reader, partitions))


def one_start(bootstrap: str, n: int, log_dir: Path, errors: dict[str, int], admin_offsets: bool) -> None:
    run = f"loop{os.getpid()}x{n}x{uuid.uuid4().hex[:4]}"
    topic, dlq, consumer_dlq = f"soak.{run}.order", f"soak.{run}.dlq", f"soak.{run}.invoices.dlq"
    group = f"soak_{run}_invoices"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    retention = {"retention.ms": "600000", "segment.bytes": str(2**27)}
    topics = [
        NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=retention),
        NewTopic(dlq, num_partitions=1, replication_factor=1),
        NewTopic(consumer_dlq, num_partitions=1, replication_factor=1),
    ]
    create_topics(admin, topics)
    children: list[subprocess.Popen[bytes]] = []
    latency = None
    reader = None if admin_offsets else Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    log = open(log_dir / f"{run}.log", "wb")  # noqa: SIM115 - closed below
    try:
        producer = subprocess.Popen(
            dying_with_parent([sys.executable, "-c", PRODUCER, bootstrap, topic, str(WARM_UP_ROWS)]),
            stdout=log,
            stderr=log,
        )
        children.append(producer)
        latency = LatencyHistograms(bootstrap, topic, f"soak-{run}-latency")
        latency.start()
        if not latency.ready.wait(30) or latency.errors:
            raise RuntimeError(f"the latency consumer did not start: {latency.errors}")
        children.append(
            subprocess.Popen(
                dying_with_parent([sys.executable, "-c", CONSUMER, bootstrap, group, topic]),
                stdout=log,
                stderr=log,
            )
        )
        offsets = Watermarks(admin, topic, PARTITIONS)
        deadline = time.monotonic() + 120
        samples = 0
        while samples < 3:
            try:
                published = sum(max(0, v) for v in offsets.read().values())
                done = consumed(admin, reader, group, topic)
            except KafkaException as exc:
                # Counted, not fatal: the crash is what this loop looks for.
                name = exc.args[0].name() if exc.args and hasattr(exc.args[0], "name") else str(exc)
                errors[name] = errors.get(name, 0) + 1
                done, published = 0, 0
            if done >= WARM_UP_ROWS and published >= WARM_UP_ROWS:
                samples += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up not consumed in 120 s ({done} of {published})")
            time.sleep(0.5)
    finally:
        if latency is not None:
            latency.stop()
        for child in children:
            if child.poll() is None:
                child.terminate()
            child.wait(30)
        log.close()
        if reader is not None:
            reader.close()
        delete_topics_with_prefix(admin, f"soak.{run}.")
        delete_groups(admin, [group])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=300)
    p.add_argument("--fresh-broker", action="store_true", help="a broker of its own, started for each start")
    p.add_argument("--port", type=int, default=31092, help="the fresh broker's port (default 31092)")
    p.add_argument("--controller-port", type=int, default=31093)
    p.add_argument("--log-dir", type=Path, default=ROOT / "bench-results" / "startup-loop")
    p.add_argument(
        "--admin-offsets", action="store_true", help="committed offsets as the soak read them then"
    )
    args = p.parse_args()
    crash_dumps()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    errors: dict[str, int] = {}
    started = time.monotonic()
    for n in range(1, args.starts + 1):
        broker: Any = None
        try:
            if args.fresh_broker:
                from tests.faults.fresh_broker import Broker

                broker = Broker(args.port, args.controller_port, "512m")
                broker.format()
                broker.spawn()
                broker.wait("started")
                bootstrap = broker.bootstrap
            else:
                bootstrap = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
            one_start(bootstrap, n, args.log_dir, errors, args.admin_offsets)
        except Exception as exc:  # a failed start is noted; only a crash ends the loop
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            print(f"start {n}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            if broker is not None:
                broker.kill()
                broker.remove()
        elapsed = time.monotonic() - started
        print(f"start {n} done ({elapsed:.0f} s); errors so far: {errors}", flush=True)
    print(f"startup-loop: {args.starts} starts, no crash; errors: {errors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
