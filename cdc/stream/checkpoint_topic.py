"""The exactly-once checkpoint topic: reading a slot's latest checkpoint back, and forgetting it.

Every pipeline in exactly-once mode writes a checkpoint record per Kafka transaction into one compacted
topic, shared by all of them (up to ten a second each). Compaction never touches the active segment, so the
topic holds far more than one record per key: a start used to read it all from the beginning. It is read
from its end instead, in windows that grow until they hold the slot's key (the latest record of a key is
the one that counts), so that a start reads about as much as the slot's own last commits, whatever the
topic's age. The topic is made with short segments (:data:`CHECKPOINT_TOPIC_CONFIG`) so that compaction
keeps it small too.

What the pipeline did not write is never taken for a checkpoint: a record of another key is another slot's,
and a value that is no checkpoint (a record someone else produced under the slot's key) is ignored, and said
once. Routing keeps every event out of this topic (:mod:`cdc.stream.route`); the ACLs of a secure deployment
keep out everyone else.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc.config import Settings
from cdc.errors import SinkError
from cdc.stream.access import CHECKPOINT_GROUP_PREFIX, authorization_refusal
from cdc.stream.admin import ask, raise_if_settling
from cdc.stream.kafka_config import admin_config
from cdc.stream.transactions import Checkpoint

log = logging.getLogger("cdc.transactions")

# Compaction keeps one record per key, but only in closed segments: an hour's segment keeps what a start
# reads small even for readers that scan the whole topic (`kafka-console-consumer`, a backup).
CHECKPOINT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
}
FIRST_WINDOW = 1_000  # records read back from the end of each partition at first
WINDOW_GROWTH = 16


def _checkpoint_consumer(settings: Settings, *, isolation: str = "read_committed") -> Consumer:
    conf: dict[str, Any] = admin_config(settings)  # the connection and security settings
    conf.update(
        {
            "group.id": f"{CHECKPOINT_GROUP_PREFIX}{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "logger": log,
        }
    )
    return Consumer(conf)


class _Found:
    """The newest record of the key seen so far: (partition, offset, timestamp, value)."""

    def __init__(self) -> None:
        self.record: tuple[int, int, int, bytes | None] | None = None
        self.malformed = 0

    def offer(self, partition: int, offset: int, timestamp: int, value: bytes | None) -> bool:
        """Whether the record is a checkpoint (or a tombstone) of the key, and so counts."""
        if value is not None:
            try:
                Checkpoint.decode(value)
            except ValueError:
                self.malformed += 1
                return False
        current = self.record
        if current is None or (current[0] == partition and offset > current[1]) or timestamp > current[2]:
            self.record = (partition, offset, timestamp, value)
        return True


def read_checkpoint(settings: Settings, key: bytes, timeout: float) -> Checkpoint | None:
    """The latest committed checkpoint under ``key``, or None when there is none, its last record is a
    tombstone (`cdc teardown`, `cdc recover`), or there is no topic yet. Bounded by ``timeout``."""
    topic = settings.checkpoint_topic
    try:
        consumer = _checkpoint_consumer(settings)
    except KafkaException as exc:
        raise SinkError(f"reading the checkpoint topic {topic}: {exc}") from exc
    deadline = time.monotonic() + timeout
    found = _Found()
    try:

        def describe(left: float) -> Any:  # a broker that is starting: "no leader yet" is not "no topic"
            found = consumer.list_topics(topic, timeout=left).topics.get(topic)
            raise_if_settling(None if found is None else found.error)
            return found

        metadata = ask(describe, what=f"metadata of {topic}", bound=timeout)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return None
        partitions = sorted(metadata.partitions)
        _wait_for_open_transactions(settings, consumer, topic, partitions, deadline, timeout)
        # Per partition: (lowest offset, where the window ends) still to read below what was read.
        todo: dict[int, tuple[int, int | None]] = {}
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=max(0.1, deadline - time.monotonic())
            )
            ends[p] = high
            if high > low:
                todo[p] = (low, None)
        if not todo:
            # Nothing to read, but a fetch is what asks Kafka for Read on the topic and Describe on the
            # reader's group: one at the end, so that a missing right refuses this start, not a later one.
            _read_windows(
                consumer,
                settings,
                topic,
                key,
                ends,
                {p: (e, None) for p, e in ends.items()},
                found,
                deadline,
                timeout,
            )
        window = FIRST_WINDOW
        while todo:
            starts = {}
            for p, (low, end) in todo.items():
                upper = (
                    end
                    if end is not None
                    else consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=max(0.1, deadline - time.monotonic())
                    )[1]
                )
                starts[p] = max(low, upper - window)
            seen = _read_windows(consumer, settings, topic, key, starts, todo, found, deadline, timeout)
            todo = {p: (low, starts[p]) for p, (low, _) in todo.items() if p not in seen and starts[p] > low}
            window *= WINDOW_GROWTH
    except KafkaException as exc:
        denied = authorization_refusal(settings, exc.args, topic=topic, operation="Read")
        if denied is not None:
            raise denied from exc
        raise SinkError(f"reading the checkpoint topic {topic}: {exc}") from exc
    finally:
        consumer.close()
    if found.malformed:
        log.warning(
            "%d records under this slot's key in %s are no checkpoint (not written by a pipeline): ignored",
            found.malformed,
            topic,
        )
    if found.record is None or found.record[3] is None:
        return None
    return Checkpoint.decode(found.record[3])


def _wait_for_open_transactions(
    settings: Settings, consumer: Consumer, topic: str, partitions: list[int], deadline: float, timeout: float
) -> None:
    """Until every transaction with a record below each partition's end (as written now, committed or not)
    has ended. A read_committed read stops at the first record of a transaction still open (the last stable
    offset): a pipeline stopped between its checkpoint and its commit leaves one, until Kafka aborts it
    (transaction.timeout.ms), and every checkpoint committed after it, this slot's latest among them, stays
    hidden. Read then, an older checkpoint would publish again what was committed. Transactions of live
    pipelines end within milliseconds of their checkpoint record (it is produced just before the commit)."""
    ends = _written_ends(settings, topic, partitions, max(0.1, deadline - time.monotonic()))
    while True:
        behind = {}
        for p in partitions:
            stable = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=max(0.1, deadline - time.monotonic()), cached=False
            )[1]
            if stable < ends[p]:
                behind[p] = stable
        if not behind:
            return
        if time.monotonic() > deadline:
            where = ", ".join(f"partition {p} from offset {o}" for p, o in sorted(behind.items()))
            raise SinkError(
                f"the checkpoint topic {topic} holds a Kafka transaction left open ({where}) for more than "
                f"{timeout:g} s: a pipeline that shares it stopped between its checkpoint and its commit. "
                "Checkpoints committed after it cannot be read until Kafka aborts it (its producer's "
                "transaction.timeout.ms) or that pipeline starts again; starting now could publish again "
                "what was committed"
            )
        time.sleep(0.1)


def _written_ends(settings: Settings, topic: str, partitions: list[int], timeout: float) -> dict[int, int]:
    """Each partition's high watermark, uncommitted records included: a read_committed consumer's is the
    last stable offset."""
    uncommitted = _checkpoint_consumer(settings, isolation="read_uncommitted")
    try:
        return {
            p: uncommitted.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)[1]
            for p in partitions
        }
    finally:
        uncommitted.close()


def _read_windows(
    consumer: Consumer,
    settings: Settings,
    topic: str,
    key: bytes,
    starts: dict[int, int],
    todo: dict[int, tuple[int, int | None]],
    found: _Found,
    deadline: float,
    timeout: float,
) -> set[int]:
    """Read each partition from ``starts[p]`` to the end of its window; the partitions where ``key`` was
    seen (a later window would only hold older records of it)."""
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])
    unread = set(starts)
    seen: set[int] = set()
    while unread:
        if time.monotonic() > deadline:
            raise SinkError(
                f"could not read the checkpoint topic {topic} within {timeout:g} s: exactly-once "
                "delivery cannot start without knowing what was committed"
            )
        for msg in consumer.consume(num_messages=1000, timeout=0.5):
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    unread.discard(partition)
                    continue
                denied = authorization_refusal(settings, [err], topic=topic, operation="Read")
                if denied is not None:
                    raise denied
                raise SinkError(f"reading the checkpoint topic {topic}: {err.str()}")
            if partition not in unread:
                continue
            end = todo[partition][1]
            offset = msg.offset() or 0
            if end is not None and offset >= end:
                unread.discard(partition)  # the rest of this window was read in an earlier one
                continue
            if msg.key() == key and found.offer(partition, offset, msg.timestamp()[1], msg.value()):
                seen.add(partition)
    consumer.unassign()
    return seen


def forget_checkpoint(settings: Settings, key: bytes, timeout: float) -> bool:
    """Write a tombstone for ``key``, so that the slot's old checkpoint is never read again (a slot dropped
    or re-created). False when the checkpoint topic does not exist: there is nothing to forget."""
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
