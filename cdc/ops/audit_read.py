"""What `cdc audit` reads from Kafka: the records of the event topics and the dead-letter topic, from the
window's start, as rows for PostgreSQL's COPY.

Each partition is read from the first offset whose timestamp is at or after the window's start minus the
margin (``offsets_for_times``: the pipeline stamps a record with its transaction's commit time, which is at
or after the row's ``created_at``), up to its high watermark when the read starts, with ``read_committed``:
an aborted exactly-once record is never seen, and a transaction still open at the end is waited for. A
partition whose oldest record is younger than that start, and which has lost records (its low watermark is
above 0), may have had the window's records deleted by retention: the audit is refused rather than report
them missing.

A record becomes one row ``(kind, id, ts, position, resolves, how)``: ``p`` for a record of an event topic
(the event's id, header ``id``), ``d`` for a dead letter (its id and ``partition:offset``), ``m`` for a
marker that resolves one (:mod:`cdc.ops.dlq`: the position it resolves, ``replayed`` or ``discarded``). Rows
go out in batches; the reader keeps no more than one batch and librdkafka's bounded fetch queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc.config import Settings
from cdc.errors import AccessDeniedError, AuditError, AuditRefusedError, first_line
from cdc.logs import kafka_log
from cdc.ops.dlq import DISCARDED_BY, REPLAYED_TO, RESOLVED
from cdc.stream.admin import ask, raise_if_settling
from cdc.stream.kafka_config import admin_config

log = logging.getLogger("cdc.audit")

Row = tuple[str, str, datetime, str | None, str | None, str | None]
BATCH_ROWS: Final = 1_000
KAFKA_TIMEOUT: Final = 30.0  # each metadata, offsets or watermark request


def consumer_config(settings: Settings) -> dict[str, Any]:
    return {
        **admin_config(settings),
        # librdkafka looks the group's coordinator up even for assigned partitions: a group of the tool's
        # own (Describe on it), never joined, nothing committed.
        "group.id": f"cdc-audit-{settings.slot}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        # Memory: at most this much fetched ahead, whatever the topics hold (measured, `make bench-audit`:
        # the fetch responses, which stay allocated while any of their records is queued, were most of the
        # peak at 4 MB). One fetch per broker holds at most fetch.max.bytes (librdkafka wants at least
        # message.max.bytes, 1 MB); a larger record still comes whole (Kafka returns the first batch).
        "queued.max.messages.kbytes": 1024,
        "queued.min.messages": 1000,
        "fetch.max.bytes": 1024 * 1024,
        # librdkafka waits this long before fetching again once the queue is full (default 1 s): with a small
        # queue the read would spend most of its time waiting.
        "fetch.queue.backoff.ms": 10,
        "logger": kafka_log,
    }


def _stamp(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class TopicReader:
    """Reads topics from a time to their high watermark; a context manager."""

    def __init__(self, settings: Settings, *, read_timeout: float) -> None:
        self.read_timeout = read_timeout
        # A broker that has just started answers "no leader yet" for a moment: asked again for this long.
        self.settle_timeout = settings.startup_timeout
        config = consumer_config(settings)
        self.group = str(config["group.id"])
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise AuditError(f"cannot make a Kafka consumer: {first_line(exc)}") from exc

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    def ranges(self, topics: Sequence[str], start_ms: int) -> dict[TopicPartition, tuple[int, int]]:
        """Per partition of the topics that exist, ``[first offset at or after start_ms, high watermark)``;
        refused when retention may have deleted records at or after ``start_ms``.

        Each topic is asked for by name: a broker leaves the topics a user may not describe out of a listing,
        and taking one for "does not exist" would report its every event missing."""
        out: dict[TopicPartition, tuple[int, int]] = {}
        for topic in topics:
            try:
                found = ask(
                    partial(self._topic, topic), what=f"metadata of {topic}", bound=self.settle_timeout
                )
            except KafkaException as exc:
                raise AuditError(f"cannot read the metadata of {topic}: {first_line(exc)}") from exc
            error = None if found is None else found.error
            if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise denied(topic)
            if found is None or error is not None:
                if error is not None and error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise AuditError(f"cannot read the metadata of {topic}: {error.str()}")
                log.info("topic %s does not exist: nothing of the window is in it", topic)
                continue
            for partition in sorted(found.partitions):
                tp = TopicPartition(topic, partition)
                out[tp] = self._range(tp, start_ms)
        return out

    def _topic(self, topic: str, left: float) -> Any:
        found = self._consumer.list_topics(topic, timeout=min(left, KAFKA_TIMEOUT)).topics.get(topic)
        raise_if_settling(None if found is None else found.error)
        return found

    def _offsets(self, tp: TopicPartition, start_ms: int, left: float) -> tuple[int, int, int]:
        wait = min(left, KAFKA_TIMEOUT)
        low, high = self._consumer.get_watermark_offsets(tp, timeout=wait)
        start = TopicPartition(tp.topic, tp.partition, start_ms)
        (found,) = self._consumer.offsets_for_times([start], timeout=wait)
        if found.error is not None:
            raise KafkaException(found.error)
        return low, high, found.offset

    def _range(self, tp: TopicPartition, start_ms: int) -> tuple[int, int]:
        try:
            low, high, offset = ask(
                lambda left: self._offsets(tp, start_ms, left),
                what=f"offsets of {tp.topic} [{tp.partition}]",
                bound=self.settle_timeout,
            )
        except KafkaException as exc:
            raise AuditError(
                f"cannot read the offsets of {tp.topic} [{tp.partition}]: {first_line(exc)}"
            ) from exc
        # -1: no record at or after start_ms.
        first = high if offset < 0 else offset
        if low > 0 and first <= low < high:
            oldest = self._timestamp_at(tp, low)
            if oldest is not None and oldest > start_ms:
                raise AuditRefusedError(
                    f"topic {tp.topic} [{tp.partition}] no longer holds records older than "
                    f"{_stamp(oldest).isoformat(timespec='seconds')} (retention deleted offsets below "
                    f"{low}), "
                    "which the window may need: audit from a later --since, or keep records longer "
                    "(the topic's retention.ms)"
                )
        return first, high

    def _timestamp_at(self, tp: TopicPartition, offset: int) -> int | None:
        self._consumer.assign([TopicPartition(tp.topic, tp.partition, offset)])
        deadline = time.monotonic() + KAFKA_TIMEOUT
        try:
            while time.monotonic() < deadline:
                msg = self._consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return None
                    continue
                return int(msg.timestamp()[1])
            return None
        finally:
            self._consumer.unassign()

    def rows(
        self, ranges: dict[TopicPartition, tuple[int, int]], classify: Callable[[Any], Row | None]
    ) -> Iterator[list[Row]]:
        """Batches of rows of every record in ``ranges``; an AuditError when a partition makes no progress
        for ``read_timeout`` seconds before its end."""
        pending = {(tp.topic, tp.partition): end for tp, (start, end) in ranges.items() if start < end}
        if not pending:
            return
        self._consumer.assign(
            [
                TopicPartition(tp.topic, tp.partition, start)
                for tp, (start, end) in ranges.items()
                if start < end
            ]
        )
        batch: list[Row] = []
        progress = time.monotonic()
        while pending:
            msg = self._consumer.poll(0.5)
            now = time.monotonic()
            if msg is None:
                if now - progress > self.read_timeout:
                    late = ", ".join(f"{t} [{p}]" for t, p in sorted(pending)[:5])
                    raise AuditError(
                        f"reading {late} made no progress for {self.read_timeout:g} s before its high "
                        "watermark (a broker down, or a transaction that stays open): run the audit again"
                    )
                continue
            progress = now
            key = (msg.topic(), msg.partition())
            offset = msg.offset() or 0
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if key in pending and offset >= pending[key]:
                        del pending[key]
                    continue
                if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise denied(msg.topic() or "?")
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise AccessDeniedError(
                        f"Kafka denies the audit the right Describe on Group:{self.group}. Grant it: "
                        f"kafka-acls.sh ... --add --allow-principal User:<user> --operation Describe "
                        f"--group {self.group}",
                        right=f"Describe on Group:{self.group}",
                    )
                if error.fatal() or not error.retriable():
                    raise AuditError(f"reading {msg.topic()} failed: {error.str()}")
                continue
            if key not in pending:
                continue
            if offset >= pending[key]:
                del pending[key]
                continue
            row = classify(msg)
            if row is not None:
                batch.append(row)
                if len(batch) >= BATCH_ROWS:
                    yield batch
                    batch = []
            if offset + 1 >= pending[key]:
                del pending[key]
        self._consumer.unassign()
        if batch:
            yield batch


def copy_rows(conn: psycopg.Connection[Any], batches: Iterator[list[Row]]) -> int:
    """The rows into the audit's ``audit_records`` table, one COPY per batch; how many."""
    count = 0
    for batch in batches:
        with (
            conn.cursor() as cur,
            cur.copy("COPY audit_records (kind, id, ts, position, resolves, how) FROM STDIN") as copy,
        ):
            for row in batch:
                copy.write_row(row)
        count += len(batch)
    return count


def denied(topic: str) -> AccessDeniedError:
    """A topic the audit may not read: a refusal naming the grant, never its events reported missing."""
    return AccessDeniedError(
        f"Kafka denies the audit the right Read (and Describe) on Topic:{topic}. Grant it: kafka-acls.sh ... "
        f"--add --allow-principal User:<user> --operation Read --operation Describe --topic {topic}",
        right=f"Read on Topic:{topic}",
    )


def header(msg: Any, name: str) -> str | None:
    for key, value in msg.headers() or ():
        if key == name:
            return bytes(value).decode(errors="replace") if value is not None else ""
    return None


def event_row(msg: Any) -> Row | None:
    """A record of an event topic: its event id (a record without one is not an outbox event)."""
    event_id = header(msg, "id")
    if not event_id:
        return None
    return ("p", event_id, _stamp(msg.timestamp()[1]), None, None, None)


def dead_letter_row(msg: Any) -> Row | None:
    """A record of the dead-letter topic: a dead letter or a marker that resolves one."""
    stamp = _stamp(msg.timestamp()[1])
    resolves = header(msg, RESOLVED)
    if resolves is not None:
        how = (
            "replayed"
            if header(msg, REPLAYED_TO) is not None
            else ("discarded" if header(msg, DISCARDED_BY) is not None else "resolved")
        )
        return ("m", "", stamp, None, resolves, how)
    event_id = header(msg, "id")
    if not event_id:
        return None  # a malformed change's letter has no event id: no row of the table is its
    return ("d", event_id, stamp, f"{msg.partition()}:{msg.offset()}", None, None)
