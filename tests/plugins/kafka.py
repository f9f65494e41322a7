"""Kafka fixtures: the bootstrap servers, an admin client, unique topics (deleted after the test) and a
helper that reads a topic from the beginning until N records or a timeout."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.plugins.services import service_missing


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    servers = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
    if not servers:
        service_missing("Kafka is not configured: CDC_KAFKA_BOOTSTRAP_SERVERS is not set")
        raise AssertionError("unreachable")
    admin = AdminClient({"bootstrap.servers": servers})
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        service_missing(f"Kafka does not answer at {servers}: {exc.args[0]}")
    return servers


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int = 1) -> None:
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=30)


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [n for n in names if n in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result(timeout=30)


@pytest.fixture
def topic_factory(
    kafka_admin: AdminClient, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., str]]:
    """`topic_factory(partitions=1, create=True)` gives a unique topic name, created unless create=False.
    Every topic named through it is deleted after the test, whoever created it."""
    names: list[str] = []

    def make(partitions: int = 1, *, create: bool = True, prefix: str = "t") -> str:
        name = unique_name(prefix)
        names.append(name)
        if create:
            create_topic(kafka_admin, name, partitions)
        return name

    yield make
    delete_topics(kafka_admin, names)


@pytest.fixture
def consume(kafka_bootstrap: str) -> Callable[..., list[Record]]:
    """`consume(topic, n, timeout=30)`: the records of `topic` from the beginning, stopping at `n` records or
    after `timeout` seconds (then it returns what it has, and the caller's assertion says what is missing)."""

    def read(topic: str, n: int, timeout: float = 30.0) -> list[Record]:
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"test-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # A topic the pipeline creates after subscribe() must be noticed within the timeout.
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        records: list[Record] = []
        # Without committed offsets, a rebalance (e.g. when a subscribed topic appears) re-reads partitions
        # from the start: count each (partition, offset) once, or tests would see phantom duplicates.
        seen: set[tuple[int, int]] = set()
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + timeout
            while len(records) < n and time.monotonic() < deadline:
                batch = consumer.consume(num_messages=min(10_000, n - len(records)), timeout=0.5)
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                            continue
                        raise KafkaException(err)
                    if (msg.partition(), msg.offset()) in seen:
                        continue
                    seen.add((msg.partition(), msg.offset()))
                    records.append(
                        Record(
                            topic=msg.topic(),
                            partition=msg.partition(),
                            offset=msg.offset(),
                            key=msg.key(),
                            value=msg.value(),
                            headers={k: v for k, v in (msg.headers() or [])},
                            timestamp_ms=msg.timestamp()[1],
                        )
                    )
        finally:
            consumer.close()
        return records

    return read
