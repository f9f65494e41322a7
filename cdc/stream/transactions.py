"""Exactly-once delivery (``delivery = "exactly-once"``): Kafka transactions with the checkpoint inside.

The producer is transactional, its ``transactional.id`` stable for the slot
(``outbox-cdc.<system identifier>.<slot>`` unless ``transactional_id`` says otherwise), so that a second
process with the same id fences the first: after its ``init_transactions()``, a zombie's late commit is
refused.

A Kafka transaction spans whole source transactions: it begins with the first source transaction after the
last commit and is committed at a source Commit once it holds ``transaction_max_events`` events or is
``transaction_max_seconds`` old (or the stream goes quiet, or the pipeline stops). Before the commit, a
checkpoint record goes into the same transaction, to the compacted ``checkpoint_topic``: key
``<system identifier>/<slot>@<slot's creation LSN>`` (:class:`cdc.stream.identity.SlotIdentity`), value the
end LSN of the last source transaction in it, that transaction's commit time and the WAL history it was
read from (system identifier, timeline). A read_committed consumer sees the events, their dead letters and
the checkpoint together or not at all.

The slot is confirmed only up to what a committed Kafka transaction covers, so the checkpoint is never
behind the slot. At start the pipeline reads the checkpoint (read_committed) and skips every source
transaction that commits below what it holds on this server (:func:`cdc.stream.identity.skip_bound`): those
the slot replays because it was confirmed late. A transaction that cannot commit is aborted and the stream
restarts from the slot, after reading the checkpoint back from Kafka (a commit taken for failed may have
gone through); a fenced producer ends the run (exit 1: another process owns the slot's transactional id).
`cdc teardown` and `cdc recover` write a tombstone for the key.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from psycopg.conninfo import conninfo_to_dict

from cdc.config import DRAIN_TRANSACTION_SECONDS, Settings
from cdc.errors import (
    DeliveryError,
    ProducerFencedError,
    SinkError,
    TransactionAbortedError,
    format_lsn,
    parse_lsn,
)
from cdc.stream.access import CHECKPOINT_GROUP_PREFIX, authorization_refusal
from cdc.stream.admin import ask, raise_if_settling
from cdc.stream.identity import ServerIdentity, SkipBound, SlotIdentity, skip_bound
from cdc.stream.sink import admin_config

log = logging.getLogger("cdc.transactions")


FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the last committed Kafka transaction covers: source transactions up to ``end_lsn`` of the WAL
    history named by ``system_id`` and ``timeline`` (:mod:`cdc.stream.identity`)."""

    end_lsn: int
    commit_time_us: int
    system_id: str | None = None
    timeline: int | None = None

    def encode(self, slot: SlotIdentity, *, database: str) -> bytes:
        commit_time = datetime.fromtimestamp(self.commit_time_us / 1e6, tz=UTC).isoformat()
        return orjson.dumps(
            {
                "system_id": self.system_id,
                "timeline": self.timeline,
                "slot": slot.slot,
                "slot_created_lsn": None if slot.created_lsn is None else format_lsn(slot.created_lsn),
                "database": database,
                "end_lsn": format_lsn(self.end_lsn),
                "commit_time": commit_time,
                "commit_time_us": self.commit_time_us,
            }
        )

    @classmethod
    def decode(cls, value: bytes) -> Checkpoint:
        data = orjson.loads(value)
        timeline = data.get("timeline")
        return cls(
            end_lsn=parse_lsn(data["end_lsn"]),
            commit_time_us=int(data["commit_time_us"]),
            system_id=data.get("system_id"),
            timeline=None if timeline is None else int(timeline),
        )

    def holds(self, server: ServerIdentity) -> SkipBound:
        """Below which LSN this checkpoint's source transactions are in Kafka, on ``server``."""
        return skip_bound(
            end_lsn=self.end_lsn, system_id=self.system_id, timeline=self.timeline, server=server
        )


def database_of(settings: Settings) -> str:
    """The database that ``database_url`` names (libpq's default: the user's name): for people reading the
    checkpoint, never part of an identity (the text of a URL is no identity)."""
    params = conninfo_to_dict(settings.database_url)
    return str(params.get("dbname") or params.get("user") or os.environ.get("PGDATABASE") or "postgres")


def transactional_id(settings: Settings, system_id: str) -> str:
    """One per slot of one PostgreSQL system, however ``database_url`` is written: two pipelines on the same
    slot fence each other, pipelines of other systems never do."""
    return settings.transactional_id or f"outbox-cdc.{system_id}.{settings.slot}"


def _checkpoint_consumer(settings: Settings) -> Consumer:
    conf: dict[str, Any] = admin_config(settings)  # the connection and security settings
    conf.update(
        {
            "group.id": f"{CHECKPOINT_GROUP_PREFIX}{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "logger": log,
        }
    )
    return Consumer(conf)


def read_checkpoint(settings: Settings, key: bytes, timeout: float) -> Checkpoint | None:
    """The latest committed checkpoint under ``key``, or None when there is none, its last record is a
    tombstone (`cdc teardown`, `cdc recover`), or there is no topic yet."""
    consumer = _checkpoint_consumer(settings)
    found: Checkpoint | None = None
    try:
        topic = settings.checkpoint_topic

        def describe(left: float) -> Any:  # a broker that is starting: "no leader yet" is not "no topic"
            found = consumer.list_topics(topic, timeout=left).topics.get(topic)
            raise_if_settling(None if found is None else found.error)
            return found

        metadata = ask(describe, what=f"metadata of {topic}", bound=timeout)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return None
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
        unread = set(metadata.partitions)
        deadline = time.monotonic() + timeout
        while unread:
            if time.monotonic() > deadline:
                raise SinkError(
                    f"could not read the checkpoint topic {topic} within {timeout:g} s: exactly-once "
                    "delivery cannot start without knowing what was committed"
                )
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        unread.discard(msg.partition())
                        continue
                    denied = authorization_refusal(settings, [err], topic=topic, operation="Read")
                    if denied is not None:
                        raise denied
                    raise SinkError(f"reading the checkpoint topic {topic}: {err.str()}")
                if msg.key() == key:
                    record = msg.value()
                    found = Checkpoint.decode(record) if record else None
    except KafkaException as exc:
        denied = authorization_refusal(settings, exc.args, topic=settings.checkpoint_topic, operation="Read")
        if denied is not None:
            raise denied from exc
        raise SinkError(f"reading the checkpoint topic {settings.checkpoint_topic}: {exc}") from exc
    finally:
        consumer.close()
    return found


def forget_checkpoint(settings: Settings, key: bytes, timeout: float) -> bool:
    """Write a tombstone for ``key``, so that the slot's old checkpoint is never read again (a slot dropped
    or re-created). False when the checkpoint topic does not exist: there is nothing to forget."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = admin_config(settings)
    conf.update({"enable.idempotence": True, "acks": "all", "logger": log})
    producer = Producer(conf)
    try:
        topic = settings.checkpoint_topic
        metadata = producer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return False
        failures: list[object] = []
        producer.produce(
            topic, None, key, on_delivery=lambda err, _msg: failures.append(err) if err else None
        )
        left = producer.flush(timeout)
    except KafkaException as exc:
        raise SinkError(
            f"writing a tombstone to the checkpoint topic {settings.checkpoint_topic}: {exc}"
        ) from exc
    if left or failures:
        reason = failures[0] if failures else f"not acknowledged within {timeout:g} s"
        raise SinkError(f"writing a tombstone to the checkpoint topic {settings.checkpoint_topic}: {reason}")
    return True


class KafkaTransaction:
    """The open Kafka transaction: what it covers and when it is due for a commit."""

    __slots__ = ("open", "started", "events", "last_end_lsn", "last_commit_us", "max_events", "max_age")

    def __init__(self, settings: Settings) -> None:
        self.open = False
        self.started = 0.0
        self.events = 0  # records of the source transactions committed into it so far
        self.last_end_lsn = 0  # the end LSN of the last source transaction committed into it
        self.last_commit_us = 0
        self.max_events = settings.transaction_max_events
        self.max_age = settings.transaction_max_seconds

    def begun(self, now: float) -> None:
        self.open, self.started, self.events = True, now, 0

    def due(self, now: float, *, draining: bool = False) -> bool:
        """Commit now: enough events, or old enough. While the pipeline drains a backlog its records are
        late by the backlog whatever the transaction's age, and every commit pauses the reading: the age
        bound is then DRAIN_TRANSACTION_SECONDS (or max_age, when longer)."""
        age = max(self.max_age, DRAIN_TRANSACTION_SECONDS) if draining else self.max_age
        return self.open and (self.events >= self.max_events or now - self.started >= age)


def classify(
    exc: KafkaException,
    what: str,
    txn_id: str,
    *,
    open_for: float | None = None,
    timeout_ms: int | None = None,
) -> DeliveryError:
    """A transactional call's failure: fenced (the run ends), or an abort and a restart from the slot.

    Kafka says "fenced" in two cases: another process registered the transactional id, or the coordinator
    aborted this one's transaction for being open longer than transaction.timeout.ms (it bumps the epoch).
    ``open_for`` (seconds the transaction was open) and ``timeout_ms`` tell which the message names."""
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    if isinstance(err, KafkaError) and err.code() in FENCED:
        if open_for is not None and timeout_ms is not None and open_for * 1000 >= timeout_ms:
            return ProducerFencedError(
                f"the Kafka transaction was open for {open_for:.0f} s, past kafka.transaction.timeout.ms "
                f"({timeout_ms} ms), and Kafka aborted it ({text}); this producer can commit nothing more, "
                "so the run stops and a restart begins again from the checkpoint. A source transaction too "
                "large to publish within it needs a larger kafka.transaction.timeout.ms"
            )
        return ProducerFencedError(
            f"the Kafka producer was fenced ({text}): another process started with transactional id "
            f"{txn_id!r}, so this one stops; a slot admits one pipeline"
        )
    return TransactionAbortedError(f"the Kafka transaction could not {what}: {text}")
