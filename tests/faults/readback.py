"""Reading a run's topics back: every partition from its first offset to its end, decoded as a consumer would.

Partitions are assigned, not subscribed (no group, no rebalance, no phantom re-reads), and read up to the high
watermark taken before reading, so the read ends. Values are decoded with the project's own
``cdc.consumer.EventDeserializer`` (the registry's schema by id, in the confluent framing), once per distinct
event id: the copies of a duplicate are the same bytes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc.consumer import EventDeserializer
from tests.faults.check import Seen


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (low, high); empty when the topic does not exist."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-{uuid.uuid4().hex}"})
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in metadata.partitions
        }
    finally:
        consumer.close()


def read_partitions(bootstrap: str, topic: str) -> Iterator[object]:
    """Every record of ``topic``, partition by partition interleaved as the consumer hands them over."""
    marks = watermarks(bootstrap, topic)
    todo = {p: high for p, (low, high) in marks.items() if high > low}
    if not todo:
        return
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"faults-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 52_428_800,
            # With Kafka transactions a partition ends with a commit marker, which is never handed over:
            # its end is known by the end-of-partition event.
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in todo])
        idle = 0
        while todo:
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            idle = 0 if batch else idle + 1
            if idle > 60:
                raise AssertionError(f"{topic}: nothing more to read for 60 s, partitions left: {todo}")
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.pop(msg.partition(), None)
                        continue
                    raise KafkaException(err)
                partition = msg.partition()
                if partition not in todo:
                    continue
                yield msg
                if msg.offset() + 1 >= todo[partition]:
                    del todo[partition]
    finally:
        consumer.close()


def read_events(bootstrap: str, topic: str, deserializer: EventDeserializer) -> list[Seen]:
    out: list[Seen] = []
    decoded: dict[str, tuple[str | None, int | None]] = {}
    for msg in read_partitions(bootstrap, topic):
        headers = _first(msg.headers())
        id_ = (headers.get("id") or b"").decode()
        hit = decoded.get(id_)
        if hit is None:
            payload = deserializer(msg).payload
            hit = decoded[id_] = (payload.get("aggregate"), payload.get("seq"))
        key = msg.key()
        out.append(
            Seen(
                topic=topic,
                partition=msg.partition(),
                offset=msg.offset(),
                key=None if key is None else key.decode(),
                id=id_,
                aggregate=hit[0],
                seq=hit[1],
            )
        )
    return out


def read_dead_letters(bootstrap: str, topic: str) -> list[Seen]:
    out = []
    for msg in read_partitions(bootstrap, topic):
        headers = _first(msg.headers())
        if headers.get("cdc_dlq_resolved") is not None:
            continue
        out.append(
            Seen(
                topic=topic,
                partition=msg.partition(),
                offset=msg.offset(),
                key=None,
                id=(headers.get("id") or b"").decode(),
            )
        )
    return out


def _first(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes | None]:
    """The first value of each header name: the system headers come before any of a row's own."""
    out: dict[str, bytes | None] = {}
    for name, value in headers or ():
        out.setdefault(name, value)
    return out
