"""How long an exactly-once start spends reading its checkpoint back, against a shared checkpoint topic that
holds ``--records`` checkpoints of other slots (a busy pipeline writes up to 864,000 a day, and compaction
never touches the active segment): the read from the topic's end (`cdc.stream.checkpoint_topic`) beside a
read of the whole topic from its beginning, as every start did before.

    . .stack/env && .venv/bin/python -m tests.bench.checkpoint_read --records 5000000
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc.config_loader import load_settings
from cdc.stream.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG, read_checkpoint
from cdc.stream.identity import SlotIdentity
from cdc.stream.transactions import Checkpoint

SLOT = SlotIdentity("7412", "bench_slot", 0x16B3748)


def fill(bootstrap: str, topic: str, records: int) -> None:
    """``records`` checkpoints of 50 other slots, with this slot's own 1,000 records before the end."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100, "batch.size": 1_000_000})
    value = Checkpoint(0x1A8A248, 1_796_000_000_000_000, "7412", 1, xid=3555).encode(SLOT, database="b")
    for i in range(records):
        key = SLOT.key if i == records - 1000 else f"7412/other-{i % 50}@0/1".encode()
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def scan_from_beginning(bootstrap: str, topic: str, key: bytes) -> bytes | None:
    """What a start did before: every record of the topic, from its first offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    found = None
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while True:
            msgs = consumer.consume(num_messages=1000, timeout=0.5)
            if any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF for m in msgs):
                break
            for m in msgs:
                if m.error() is None and m.key() == key:
                    found = m.value()
    finally:
        consumer.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    args = parser.parse_args()
    bootstrap = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"bench-ckpt-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=1, config=CHECKPOINT_TOPIC_CONFIG)
    admin.create_topics([new])[topic].result(timeout=30)
    try:
        started = time.monotonic()
        fill(bootstrap, topic, args.records)
        took = time.monotonic() - started
        print(f"checkpoint topic {topic}: {args.records:,} records written in {took:.0f} s")
        settings = load_settings(
            config_file=None,
            environ={"CDC_DATABASE_URL": "postgresql://bench@localhost/bench"},
            overrides={"kafka.bootstrap_servers": bootstrap, "checkpoint_topic": topic},
        )
        for _ in range(2):
            started = time.monotonic()
            found = read_checkpoint(settings, SLOT.key, timeout=600)
            tail = time.monotonic() - started
            started = time.monotonic()
            whole = scan_from_beginning(bootstrap, topic, SLOT.key)
            scan = time.monotonic() - started
            assert found is not None and whole is not None
            print(f"read from the end: {tail:.2f} s | read from the beginning: {scan:.2f} s")
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


if __name__ == "__main__":
    main()
