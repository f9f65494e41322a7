"""Kafka fixtures: the bootstrap servers, an admin client, unique topics (deleted after the test) and a
helper that reads a topic from the beginning until N records or a timeout."""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc.cli.process_end import librdkafka_threads
from tests.kafka_admin import committed_offsets, create_topic, delete_topics
from tests.plugins.services import service_missing

__all__ = ["create_topic", "delete_topics"]  # used by the tests through this module

# The librdkafka keys of the secure stack's connection (CDC_KAFKA_<KEY> in .stack/env), apart from the
# bootstrap servers.
_SECURITY_ENV = (
    "CDC_KAFKA_SECURITY_PROTOCOL",
    "CDC_KAFKA_SASL_MECHANISM",
    "CDC_KAFKA_SASL_USERNAME",
    "CDC_KAFKA_SASL_PASSWORD",
    "CDC_KAFKA_SSL_CA_LOCATION",
)


def _secured(bootstrap: str | None) -> bool:
    """Whether `bootstrap` is the secure stack's broker (CDC_STACK_SECURE=1): a private broker of a test is
    plaintext whatever the stack is."""
    return os.environ.get("CDC_STACK_SECURE") == "1" and bootstrap == os.environ.get(
        "CDC_KAFKA_BOOTSTRAP_SERVERS"
    )


def client_config(bootstrap: str, *, user: str = "admin") -> dict[str, str]:
    """The connection settings of a test's own client: the bootstrap servers and, on the secure stack,
    SASL_SSL as one of its users (``admin``, the super user; ``consumer``; ``cdc``, the pipeline's)."""
    conf = {"bootstrap.servers": bootstrap}
    if _secured(bootstrap):
        env = os.environ
        conf.update(
            {
                "security.protocol": env["CDC_KAFKA_SECURITY_PROTOCOL"],
                "sasl.mechanism": env["CDC_KAFKA_SASL_MECHANISM"],
                "ssl.ca.location": env["CDC_KAFKA_SSL_CA_LOCATION"],
            }
        )
        if user == "cdc":
            conf.update(
                {
                    "sasl.username": env["CDC_KAFKA_SASL_USERNAME"],
                    "sasl.password": env["CDC_KAFKA_SASL_PASSWORD"],
                }
            )
        else:
            prefix = f"CDC_STACK_KAFKA_{user.upper()}_"
            conf.update(
                {"sasl.username": env[prefix + "USERNAME"], "sasl.password": env[prefix + "PASSWORD"]}
            )
    return conf


def kafka_security_env(bootstrap: str | None) -> dict[str, str]:
    """The CDC_KAFKA_* variables that connect the pipeline to `bootstrap` as the stack's ``cdc`` user: empty
    but on the secure stack."""
    return {k: os.environ[k] for k in _SECURITY_ENV if k in os.environ} if _secured(bootstrap) else {}


def with_stack_security(env: dict[str, str]) -> dict[str, str]:
    """A `cdc` subprocess's environment, secured as the stack is: the security variables of the broker and
    the registry it is given when they are the secure stack's (those the test set itself win); a plaintext
    broker of a test's own gets none (the outbox's environment holds none of them)."""
    # What the test set itself (another user, say) stays.
    out = {**kafka_security_env(env.get("CDC_KAFKA_BOOTSTRAP_SERVERS")), **env}
    ca = os.environ.get("CDC_SCHEMA_REGISTRY_CA_FILE")
    registry = env.get("CDC_SCHEMA_REGISTRY_URL")
    # Every HTTPS registry of the tests is the stack's, directly or through a test's proxy.
    if ca and registry and registry.startswith("https://"):
        out.setdefault("CDC_SCHEMA_REGISTRY_CA_FILE", ca)
    return out


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
    admin = AdminClient(client_config(servers))
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        service_missing(f"Kafka does not answer at {servers}: {exc.args[0]}")
    _wait_for_group_coordinator(servers)
    return servers


def _wait_for_group_coordinator(servers: str) -> None:
    """The first consumer group of a fresh broker creates __consumer_offsets and loads its coordinator: for
    some seconds, group calls fail with NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS. Wait for that once
    here (tests.kafka_admin asks again while it lasts), rather than in whichever test happens to run first."""
    consumer = Consumer({**client_config(servers), "group.id": f"test-warm-up-{uuid.uuid4().hex}"})
    try:
        committed_offsets(consumer, [TopicPartition("__warm_up", 0)])
    except KafkaException as exc:
        raise AssertionError(f"Kafka's group coordinator is not ready: {exc.args[0]}") from exc
    finally:
        consumer.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The tests' own Kafka clients end before pytest's process does: one still alive at exit can crash it
    (cdc.cli.process_end says why). A client that a failed test's traceback keeps in a cycle is collected."""
    if librdkafka_threads():
        gc.collect()


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient(client_config(kafka_bootstrap))


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


def first_headers(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """The first value of each header name, as consumers read them: the pipeline's own come first."""
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        out.setdefault(name, value or b"")
    return out


def read_topic(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> list[Record]:
    """The records of `topic` from the beginning, stopping at `n` records or after `timeout` seconds (then
    it returns what it has, and the caller's assertion says what is missing). Waits for the topic to exist.
    Partitions are assigned, not subscribed: no consumer group to form, and no rebalance that would re-read
    a partition and show phantom duplicates."""
    return read_topics(bootstrap, [topic], n, timeout)


def read_topics(
    bootstrap: str,
    topics: list[str],
    n: int,
    timeout: float = 30.0,
    *,
    check: Callable[[], None] | None = None,
) -> list[Record]:
    """`read_topic` over several topics with one consumer: `n` records in all. `check` is called between
    polls (a relay's liveness check, say), so that a crashed writer fails the wait at once. One consumer
    kept for the whole wait: a fresh consumer per poll may stop short of records a slow first fetch
    has not brought yet, and never reach `n` on a loaded machine."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    records: list[Record] = []
    try:
        deadline = time.monotonic() + timeout
        assignment: list[TopicPartition] = []
        for topic in topics:
            while True:  # the pipeline may not have created the topic yet
                metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
                if metadata is not None and metadata.error is None and metadata.partitions:
                    break
                if time.monotonic() >= deadline:
                    return records
                if check is not None:
                    check()
                time.sleep(0.2)
            assignment += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        consumer.assign(assignment)
        while len(records) < n and time.monotonic() < deadline:
            if check is not None:
                check()
            for msg in consumer.consume(num_messages=min(10_000, n - len(records)), timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                        continue
                    raise KafkaException(err)
                records.append(
                    Record(
                        topic=msg.topic(),
                        partition=msg.partition(),
                        offset=msg.offset(),
                        key=msg.key(),
                        value=msg.value(),
                        headers=first_headers(msg.headers()),
                        timestamp_ms=msg.timestamp()[1],
                    )
                )
    finally:
        consumer.close()
    return records


@pytest.fixture
def consume(kafka_bootstrap: str) -> Callable[..., list[Record]]:
    """`consume(topic, n, timeout=30)`: `read_topic` on the shared broker."""

    def read(topic: str, n: int, timeout: float = 30.0) -> list[Record]:
        return read_topic(kafka_bootstrap, topic, n, timeout)

    return read


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (the Java producer's default partitioner hashes the key bytes with it), as an
    unsigned 32-bit value."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def java_partition(key: bytes, partitions: int) -> int:
    """Where Kafka's Java producer puts a record with this key: toPositive(murmur2(key)) % partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
