"""The consumer's dead-letter path with Kafka faked: what the per-record path (cdc.consumer.records.Records)
sends to the dead-letter topic through cdc.consumer.dead_letters.DeadLetters (over a fake producer), and when
the record is then finished or the consumer stops instead.

The database is never reached: these records are dead-lettered before their transaction.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cdc.consumer import EventDeserializer, RetryPolicy
from cdc.consumer.dead_letters import DeadLetters, producer_config
from cdc.consumer.records import Records
from cdc.consumer.session import consumer_config
from cdc.errors import ConfigError, ConsumerError, TopicMissingError
from tests.unit.consumer.fakes import FakeConnection, FakeProducer
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


class Service:
    """The per-record path of the service ``inv``, its dead letters going to ``producer``: ``finished`` are
    the records it reported done (their offsets to be committed), ``counts`` what it counted."""

    def __init__(self, producer: FakeProducer) -> None:
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}
        self.finished: list[Any] = []
        letters = DeadLetters(
            producer_config(consumer_config("k:1", "inv"), "murmur2_random"),
            "inv.dlq",
            consumer="inv",
            counts=self.counts,
            producer=producer,
        )
        letters.open()
        self.records = Records(
            FakeConnection(),
            handler=lambda conn, event: None,
            deserializer=EventDeserializer(SCHEMAS),
            table=None,  # type: ignore[arg-type]  # never reached: no record gets to its transaction
            name="inv",
            retry=RetryPolicy(),
            on_retries_exhausted="stop",
            dead_letter=letters.send,
            done=lambda *messages: self.finished.extend(messages),
            stop=threading.Event(),
            counts=self.counts,
        )

    def process(self, message: Any) -> None:
        self.records.process(message)


def service(producer: FakeProducer) -> Service:
    return Service(producer)


def test_the_producer_connects_as_the_consumer_does_and_partitions_as_the_pipeline() -> None:
    consumer = consumer_config("k:1", "g", {"security.protocol": "SASL_SSL", "session.timeout.ms": 6000})
    conf = producer_config(consumer, "consistent_random")
    assert (conf["bootstrap.servers"], conf["security.protocol"]) == ("k:1", "SASL_SSL")
    assert "session.timeout.ms" not in conf and "group.id" not in conf
    assert (conf["enable.idempotence"], conf["acks"]) == (True, "all")
    assert conf["partitioner"] == "consistent_random"
    with pytest.raises(ConfigError) as refused:
        producer_config(consumer, "murmur2")
    assert refused.value.key == "partitioner"


def test_a_dead_letter_topic_that_does_not_exist_is_refused_at_open() -> None:
    letters = DeadLetters({}, "missing.dlq", consumer="inv", counts={}, producer=FakeProducer())
    with pytest.raises(TopicMissingError, match="'missing.dlq' does not exist: create it first"):
        letters.open()


@pytest.mark.parametrize("value", [b"\x00\x00\x07", b"\x00"], ids=["3-bytes", "1-byte"])
def test_a_confluent_value_shorter_than_its_header_is_dead_lettered_not_a_crash(value: bytes) -> None:
    producer = FakeProducer()
    consumer = service(producer)
    message = Message(value, [("id", b"e-1")])
    consumer.process(message)
    (letter,) = producer.sent
    headers = dict(letter.headers)
    assert (letter.topic, letter.key, letter.value) == ("inv.dlq", b"o-1", value)
    assert (headers["error_class"], headers["error_reason"]) == (b"DeserializationError", b"undecodable")
    assert headers["id"] == b"e-1"
    assert consumer.finished == [message], "the partition moves on"
    assert consumer.counts["dead_lettered"] == 1


@pytest.mark.parametrize("broker", [False, True], ids=["producer-limit", "topic-limit"])
def test_a_dead_letter_with_large_headers_and_key_is_sent_without_them(broker: bool) -> None:
    producer = FakeProducer(limit=20_000, broker=broker)
    consumer = service(producer)
    own: list[tuple[str, bytes | None]] = [("id", b"e-1"), ("event_type", b"OrderPlaced")]
    own += [(f"row-{i}", b"h" * 1000) for i in range(30)]
    message = Message(b"not avro", own, b"k" * 5000)
    consumer.process(message)
    (letter,) = producer.sent
    assert len(producer.refused) == 1 and producer.refused[0].headers[-1] == ("row-29", b"h" * 1000)
    names = [k for k, _ in letter.headers]
    assert names == [*ERROR_HEADERS, "id", "reduced"], "the record's own headers are dropped, its id kept"
    headers = dict(letter.headers)
    assert (headers["error_reason"], headers["id"]) == (b"undecodable", b"e-1")
    assert letter.key == b"k" * 256, "the key is cut"
    assert letter.value == b"not avro", "the value fits: kept"
    assert headers["reduced"] == b"left out: the record's own headers but id, the key after 256 bytes"
    assert consumer.finished == [message]
    assert consumer.counts["dead_lettered"] == 1, "counted once, after it was delivered"


@pytest.mark.parametrize("broker", [False, True], ids=["producer-limit", "topic-limit"])
def test_a_dead_letter_whose_value_does_not_fit_is_sent_without_it(broker: bool) -> None:
    producer = FakeProducer(limit=20_000, broker=broker)
    consumer = service(producer)
    message = Message(b"not avro" + b"v" * 30_000, [("id", b"e-2"), ("big", b"h" * 30_000)])
    consumer.process(message)
    (letter,) = producer.sent
    assert len(producer.refused) == 2
    headers = dict(letter.headers)
    assert (letter.key, letter.value, headers["id"]) == (b"o-1", None, b"e-2")
    assert headers["reduced"] == b"left out: the value, the record's own headers but id"
    assert (headers["original_topic"], headers["original_offset"]) == (b"outbox.event.order", b"41")
    assert consumer.finished == [message]
    assert consumer.counts["dead_lettered"] == 1


def test_a_dead_letter_that_never_fits_stops_the_consumer_unacknowledged() -> None:
    producer = FakeProducer(limit=100, broker=True)
    consumer = service(producer)
    with pytest.raises(
        ConsumerError, match=r"cannot write record at outbox\.event\.order\[2\]@41 to inv\.dlq"
    ):
        consumer.process(Message(b"not avro", [("id", b"e-3")]))
    assert producer.sent == [] and consumer.finished == []
    assert consumer.counts["dead_lettered"] == 0
