"""IdempotentConsumer's per-record path, Kafka faked: what reaches its dead-letter topic, and when it stops.

The database is never reached: these records are dead-lettered before their transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc.consumer import EventDeserializer, IdempotentConsumer
from cdc.errors import ConsumerError
from tests.unit.consumer.offline import offline_consumer
from tests.unit.fake_message import Message

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
ERROR_HEADERS = [
    "error_class",
    "error_reason",
    "error_message",
    "original_topic",
    "original_partition",
    "original_offset",
    "consumer",
]


@dataclass
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + sum(len(k) + len(v) for k, v in self.headers)


@dataclass
class FakeProducer:
    """Refuses a record above ``limit`` bytes as librdkafka does: at produce() (its own message.max.bytes)
    or, with ``broker=True``, in the delivery report (the topic's max.message.bytes)."""

    limit: int = 1_000_000
    broker: bool = False
    sent: list[Sent] = field(default_factory=list)  # delivered
    refused: list[Sent] = field(default_factory=list)
    _reports: list[Any] = field(default_factory=list)

    def produce(
        self, topic: str, *, key: Any, value: Any, headers: Any, timestamp: int, on_delivery: Any
    ) -> None:
        record = Sent(topic, key, value, list(headers))
        too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if record.size() > self.limit else None
        if too_large is not None and not self.broker:
            self.refused.append(record)
            raise KafkaException(too_large)
        (self.refused if too_large else self.sent).append(record)
        self._reports.append(lambda: on_delivery(too_large, None))

    def flush(self, timeout: float) -> int:
        while self._reports:
            self._reports.pop(0)()
        return 0


class FakeConsumer:
    def __init__(self) -> None:
        self.committed: list[tuple[str, int, int]] = []

    def commit(self, *, offsets: list[Any], asynchronous: bool) -> None:
        self.committed += [(tp.topic, tp.partition, tp.offset) for tp in offsets]


def service(producer: FakeProducer) -> tuple[IdempotentConsumer, FakeConsumer]:
    consumer = offline_consumer(deserializer=EventDeserializer(SCHEMAS))
    kafka = FakeConsumer()
    consumer._producer, consumer._consumer = producer, kafka
    return consumer, kafka


@pytest.mark.parametrize("value", [b"\x00\x00\x07", b"\x00"], ids=["3-bytes", "1-byte"])
def test_a_confluent_value_shorter_than_its_header_is_dead_lettered_not_a_crash(value: bytes) -> None:
    producer = FakeProducer()
    consumer, kafka = service(producer)
    consumer._process(Message(value, [("id", b"e-1")]))
    (letter,) = producer.sent
    headers = dict(letter.headers)
    assert (letter.topic, letter.key, letter.value) == ("inv.dlq", b"o-1", value)
    assert (headers["error_class"], headers["error_reason"]) == (b"DeserializationError", b"undecodable")
    assert headers["id"] == b"e-1"
    assert kafka.committed == [("outbox.event.order", 2, 42)], "the partition moves on"
    assert consumer.counts["dead_lettered"] == 1


@pytest.mark.parametrize("broker", [False, True], ids=["producer-limit", "topic-limit"])
def test_a_dead_letter_with_large_headers_and_key_is_sent_without_them(broker: bool) -> None:
    producer = FakeProducer(limit=20_000, broker=broker)
    consumer, kafka = service(producer)
    own: list[tuple[str, bytes | None]] = [("id", b"e-1"), ("event_type", b"OrderPlaced")]
    own += [(f"row-{i}", b"h" * 1000) for i in range(30)]
    message = Message(b"not avro", own, b"k" * 5000)
    consumer._process(message)
    (letter,) = producer.sent
    assert len(producer.refused) == 1 and producer.refused[0].headers[-1] == ("row-29", b"h" * 1000)
    names = [k for k, _ in letter.headers]
    assert names == [*ERROR_HEADERS, "id", "reduced"], "the record's own headers are dropped, its id kept"
    headers = dict(letter.headers)
    assert (headers["error_reason"], headers["id"]) == (b"undecodable", b"e-1")
    assert letter.key == b"k" * 256, "the key is cut"
    assert letter.value == b"not avro", "the value fits: kept"
    assert headers["reduced"] == b"left out: the record's own headers but id, the key after 256 bytes"
    assert kafka.committed == [("outbox.event.order", 2, 42)]
    assert consumer.counts["dead_lettered"] == 1, "counted once, after it was delivered"


@pytest.mark.parametrize("broker", [False, True], ids=["producer-limit", "topic-limit"])
def test_a_dead_letter_whose_value_does_not_fit_is_sent_without_it(broker: bool) -> None:
    producer = FakeProducer(limit=20_000, broker=broker)
    consumer, kafka = service(producer)
    message = Message(b"not avro" + b"v" * 30_000, [("id", b"e-2"), ("big", b"h" * 30_000)])
    consumer._process(message)
    (letter,) = producer.sent
    assert len(producer.refused) == 2
    headers = dict(letter.headers)
    assert (letter.key, letter.value, headers["id"]) == (b"o-1", None, b"e-2")
    assert headers["reduced"] == b"left out: the value, the record's own headers but id"
    assert (headers["original_topic"], headers["original_offset"]) == (b"outbox.event.order", b"41")
    assert kafka.committed == [("outbox.event.order", 2, 42)]
    assert consumer.counts["dead_lettered"] == 1


def test_a_dead_letter_that_never_fits_stops_the_consumer_unacknowledged() -> None:
    producer = FakeProducer(limit=100, broker=True)
    consumer, kafka = service(producer)
    with pytest.raises(
        ConsumerError, match=r"cannot write record at outbox\.event\.order\[2\]@41 to inv\.dlq"
    ):
        consumer._process(Message(b"not avro", [("id", b"e-3")]))
    assert producer.sent == [] and kafka.committed == []
    assert consumer.counts["dead_lettered"] == 0
