"""Dead-letter tooling (``cdc dlq list|show|replay|discard``), in the spirit of a failure transport.

Once the cause of a dead letter is fixed (a schema added, a registry that accepts it again) the record is
replayed: encoded with the *current* schemas as the pipeline would, and published to its original topic with
its original key, timestamp and headers by an idempotent producer. One that is not worth publishing is
discarded instead (like Symfony Messenger's ``messenger:failed:remove``). Kafka cannot delete a record, so
"resolved" is appended: after Kafka acknowledged a replay, or for a discard, a *marker* goes to the
dead-letter topic, into the partition of the record it resolves (no key, no value, header
``cdc_dlq_resolved = <partition>:<offset>``, and ``replayed_to = <topic>`` for a replay or
``discarded_by = <who>`` and ``discard_reason = <why>`` for a discard). ``cdc dlq show`` finds a resolved
record too and says how it was resolved.

Reading uses a consumer group of the tool's own, ``cdc-dlq-<dlq_topic>``, as a bookmark only: partitions are
assigned explicitly (no membership, no rebalance) and read from the committed offset (or the beginning) up
to the high watermark taken when the scan starts, so a scan ends while the pipeline keeps writing. After a
replay each partition's offset moves to the first offset that is neither resolved nor a marker.

A record's ID is its event id (header ``id``), or ``<partition>:<offset>`` when it has none (a malformed
change). An event dead-lettered twice (the pipeline re-published a transaction after a crash) is listed once,
as its latest copy; replaying it resolves every copy. Payloads are never logged and only shown on request.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc.config import Settings
from cdc.errors import AccessDeniedError, CdcError, DeadLetterError
from cdc.logs import kafka_log
from cdc.stream.access import authorization_refusal, refusal_for_right
from cdc.stream.admin import ask, raise_if_settling
from cdc.stream.kafka_config import admin_config

__all__ = ["DeadLetter", "DeadLetterTopic", "Scan"]

log = logging.getLogger("cdc.dlq")

SUMMARY: Final = ("id", "event_type", "schema_version", "reason", "time", "position")
ERROR_HEADERS: Final = ("error_class", "error_reason", "error_message", "original_topic")
RESOLVED: Final = "cdc_dlq_resolved"
REPLAYED_FROM: Final = "cdc_replayed_from"
REPLAYED_TO: Final = "replayed_to"  # marker headers: how the record was resolved
DISCARDED_BY: Final = "discarded_by"
DISCARD_REASON: Final = "discard_reason"
_POSITION: Final = re.compile(r"(\d+):(\d+)\Z")
Position = tuple[int, int]  # (partition, offset)


def parse_id(text: str) -> str | Position:
    """A record ID as typed: ``<partition>:<offset>`` is a position, anything else an event id."""
    if not (text := text.strip()):
        raise DeadLetterError("an empty dead-letter record id; `cdc dlq list` shows them")
    match = _POSITION.match(text)
    return (int(match[1]), int(match[2])) if match else text


def split_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], dict[str, bytes]]:
    """``(original headers, error headers)``. The pipeline writes the error headers first, so only the first
    occurrence of each name is the error's: a row header that happens to share the name is the row's own."""
    original, errors = list[tuple[str, bytes]](), dict[str, bytes]()
    for key, value in headers:
        if key in ERROR_HEADERS and key not in errors:
            errors[key] = value
        else:
            original.append((key, value))
    return original, errors


def resume_offset(start: int, end: int, unresolved: Iterable[int], markers: Iterable[int] = ()) -> int:
    """Where the next scan of a partition may start: the first offset that is neither resolved nor a marker.

    ``[start, end)`` was scanned, ``unresolved`` are its unresolved records, ``markers`` the offsets of the
    markers written since (``>= end``). This is safe to commit because a marker goes to its record's
    partition after it, so above it: a target at or above the committed offset has its marker above it too,
    and the next scan sees both. Past ``end`` only our markers are known, so the offset moves through them
    only while they are contiguous: a gap may hold a new dead letter nobody has seen.
    """
    if pending := [offset for offset in unresolved if start <= offset < end]:
        return min(pending)
    offset, ours = end, set(markers)
    while offset in ours:
        offset += 1
    return offset


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic: a dead letter, or a marker (header ``cdc_dlq_resolved``)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> str:
        return next((v.decode(errors="replace") for k, v in self.headers if k == name), "")

    @property
    def position(self) -> Position:
        return self.partition, self.offset

    @property
    def id(self) -> str:
        return self.header("id") or f"{self.partition}:{self.offset}"

    def summary(self) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(self.timestamp_ms / 1000, UTC).isoformat(timespec="milliseconds")
        h, stamp = self.header, stamp.replace("+00:00", "Z")
        values = (self.id, h("event_type"), h("schema_version"), h("error_reason"), stamp, _at(self.position))
        return dict(zip(SUMMARY, values, strict=True))

    def resolution(self) -> dict[str, str]:
        """What this marker says of the record it resolves: replayed (to a topic) or discarded (by whom,
        why), when, and where the marker is."""
        stamp = datetime.fromtimestamp(self.timestamp_ms / 1000, UTC).isoformat(timespec="milliseconds")
        out = {"time": stamp.replace("+00:00", "Z"), "marker": _at(self.position)}
        if any(k == DISCARDED_BY for k, _ in self.headers):
            by, why = self.header(DISCARDED_BY), self.header(DISCARD_REASON)
            return {"outcome": "discarded", "by": by, "reason": why, **out}
        return {"outcome": "replayed", "to": self.header(REPLAYED_TO), **out}

    def details(self, payload: bool = False) -> dict[str, Any]:
        out = {**self.summary(), "message": self.header("error_message")}
        out["original_topic"] = self.header("original_topic")
        out["key"] = None if self.key is None else self.key.decode(errors="replace")
        # Pairs, not an object: header names may repeat, and "all headers" means all of them.
        out["headers"] = [[k, v.decode(errors="replace")] for k, v in self.headers]
        if payload:
            try:
                out["payload"] = None if self.value is None else orjson.loads(self.value)
            except orjson.JSONDecodeError:
                out["payload"] = self.value.decode(errors="replace") if self.value else None
        return out


@dataclass
class Scan:
    """One read of the dead-letter topic: its dead letters, the positions markers resolve, the ranges read."""

    topic: str
    ranges: dict[int, tuple[int, int]]  # partition -> [start, end)
    records: list[DeadLetter]  # in (partition, offset) order
    resolved: set[Position] = field(default_factory=set)
    markers: dict[Position, DeadLetter] = field(default_factory=dict)  # the first marker of each position

    @classmethod
    def of(cls, topic: str, ranges: dict[int, tuple[int, int]], read: Iterable[DeadLetter]) -> Scan:
        """Markers folded over what was read: a marker resolves a position, and is no dead letter itself."""
        read = sorted(read, key=lambda r: r.position)
        markers: dict[Position, DeadLetter] = {}
        for r in read:
            if isinstance(target := parse_id(r.header(RESOLVED) or "-"), tuple):
                markers.setdefault(target, r)
        return cls(topic, ranges, [r for r in read if not r.header(RESOLVED)], set(markers), markers)

    def unresolved(self) -> list[DeadLetter]:
        """Every unresolved record, copies of one event included."""
        return [r for r in self.records if r.position not in self.resolved]

    def listing(self) -> list[DeadLetter]:
        """One record per ID, its latest copy, in (partition, offset) order."""
        latest: dict[str, DeadLetter] = {}
        for r in self.unresolved():
            known = latest.get(r.id)
            if known is None or (r.timestamp_ms, r.offset) >= (known.timestamp_ms, known.offset):
                latest[r.id] = r
        return sorted(latest.values(), key=lambda r: r.position)

    def by_reason(self) -> dict[str, int]:
        """How many listed (unresolved) records each reason has, the most first."""
        counts: defaultdict[str, int] = defaultdict(int)
        for r in self.listing():
            counts[r.header("error_reason") or "(none)"] += 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def find_any(self, text: str) -> DeadLetter:
        """The record of an ID, resolved or not (its latest copy): for ``cdc dlq show``."""
        try:
            return self.find(text)
        except DeadLetterError:
            wanted = parse_id(text)
            found = [r for r in self.records if wanted in (r.id, r.position)]
            if not found:
                raise
            rid = found[0].id
            return max((r for r in self.records if r.id == rid), key=lambda r: (r.timestamp_ms, r.offset))

    def details(self, record: DeadLetter, payload: bool = False) -> dict[str, Any]:
        """``record.details()`` and how it was resolved (None: it is not)."""
        marker = self.markers.get(record.position)
        return {**record.details(payload), "resolution": None if marker is None else marker.resolution()}

    def copies(self, record: DeadLetter) -> list[DeadLetter]:
        return [r for r in self.unresolved() if r.id == record.id]

    def find(self, text: str) -> DeadLetter:
        """The listed record of an ID in either form (the position of an older copy finds the latest)."""
        wanted = parse_id(text)
        found = next((r for r in self.unresolved() if wanted in (r.id, r.position)), None)
        if found is None:
            raise DeadLetterError(
                f"no unresolved dead-letter record with id {text.strip()}; `cdc dlq list` shows them"
            )
        return next(r for r in self.listing() if r.id == found.id)

    def resume_offsets(self, markers: dict[int, list[int]]) -> dict[int, int]:
        """The offset to commit per partition whose bookmark moves forward (see resume_offset)."""
        pending: defaultdict[int, list[int]] = defaultdict(list)
        for r in self.unresolved():
            pending[r.partition].append(r.offset)
        moved = {p: resume_offset(s, e, pending[p], markers.get(p, ())) for p, (s, e) in self.ranges.items()}
        return {p: offset for p, offset in sorted(moved.items()) if offset > self.ranges[p][0]}


class DeadLetterTopic(AbstractContextManager["DeadLetterTopic"]):
    """Reads ``settings.dlq_topic`` with the tool's consumer group; a context manager."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.topic, self.servers = (
            settings,
            settings.dlq_topic,
            settings.kafka.bootstrap_servers,
        )
        self.group = f"cdc-dlq-{self.topic}"
        self.timeout = settings.startup_timeout  # each wait for Kafka, and the longest read without progress
        # Connection and security keys only: producer tuning keys (linger.ms...) are errors to a consumer.
        # librdkafka logs every failed connect attempt; the one-line error says the same, so only critical.
        conf = {**admin_config(settings), "group.id": self.group, "enable.auto.commit": False}
        conf |= {"auto.offset.reset": "earliest", "logger": kafka_log, "log_level": 2}
        try:
            self._consumer = Consumer(conf)
            # The group is described through the admin API before its offsets are read (see _committed).
            admin = admin_config(settings)
            admin |= {"logger": kafka_log, "log_level": 2}
            self._admin = AdminClient(admin)
        except KafkaException as exc:
            raise DeadLetterError(f"cannot create a Kafka consumer: {_reason(exc)}") from exc

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    def _fail(self, exc: KafkaException | KafkaError | str, waited: float | None = None) -> CdcError:
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
        if isinstance(err, KafkaError) and (denied := self._denied(err)) is not None:
            return denied
        return DeadLetterError(
            f"reading the dead-letter topic '{self.topic}' at {self.servers} failed: {_reason(exc)}"
            + ("" if waited is None else f", waited {waited:g} s")
            + " (check kafka.bootstrap_servers / CDC_KAFKA_BOOTSTRAP_SERVERS and that the broker is up)"
        )

    def _denied(self, error: KafkaError) -> AccessDeniedError | None:
        """A right the tool lacks, named with its grant: never taken for a broker that is down, nor for a
        topic that does not exist."""
        if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return refusal_for_right(
                self.settings, "Read", "Topic", self.topic, "reading the dead-letter topic"
            )
        if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            why = "the committed offsets that keep the dead-letter tools' place"
            return refusal_for_right(self.settings, "Read", "Group", self.group, why, literal=True)
        return None

    def scan(self, *, from_start: bool = False) -> Scan:
        """The topic from the bookmark (or, ``from_start``, from its first record) to its current end."""
        topic, wait = self.topic, self.timeout
        try:
            found = ask(self._metadata, what=f"metadata of {topic}", bound=wait)
            if found is not None and found.error is not None and (denied := self._denied(found.error)):
                raise denied
            if found is None or found.error is not None or not found.partitions:
                raise DeadLetterError(
                    f"the dead-letter topic '{topic}' does not exist at {self.servers}: nothing was "
                    "dead-lettered yet, or dlq_topic (CDC_DLQ_TOPIC) names another topic"
                )
            ranges: dict[int, tuple[int, int]] = {}
            for tp in self._committed([TopicPartition(topic, p) for p in sorted(found.partitions)]):
                low, high = ask(
                    partial(self._watermarks, tp.partition),
                    what=f"offsets of {topic} [{tp.partition}]",
                    bound=wait,
                )
                # No bookmark yet, or one from a deleted and re-created topic: from the beginning.
                bookmark = low <= tp.offset <= high and not from_start
                ranges[tp.partition] = (tp.offset if bookmark else low, high)
        except KafkaException as exc:
            raise self._fail(exc, waited=wait) from exc
        return Scan.of(topic, ranges, self._read(ranges))

    def _watermarks(self, partition: int, left: float) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), min(left, self.timeout)
        )
        return low, high

    def _metadata(self, left: float) -> Any:
        found = self._consumer.list_topics(self.topic, timeout=min(left, self.timeout)).topics.get(self.topic)
        raise_if_settling(None if found is None else found.error)
        return found

    def _committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The group's committed offset of each partition (OFFSET_INVALID where it has none), as the tool's
        consumer, a member of the group that never joins it, reads them. The group is described through the
        admin API first: a denied group is named at once there, where committed() would retry the coordinator
        lookup Kafka refuses until its timeout. Not the admin API's list_consumer_group_offsets, which
        crashes librdkafka when the group's coordinator is starting or moving (cdc.stream.admin)."""

        def describe(left: float) -> None:
            wait = min(left, self.timeout)
            self._admin.describe_consumer_groups([self.group], request_timeout=wait)[self.group].result(left)

        ask(describe, what=f"describe group {self.group}", bound=self.timeout)
        found: list[TopicPartition] = ask(
            lambda left: self._consumer.committed(partitions, timeout=min(left, self.timeout)),
            what=f"committed offsets of group {self.group}",
            bound=self.timeout,
        )
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
        return found

    def _read(self, ranges: dict[int, tuple[int, int]]) -> list[DeadLetter]:
        consumer, out = self._consumer, []
        pending = {p: end for p, (start, end) in ranges.items() if start < end}
        consumer.assign([TopicPartition(self.topic, p, ranges[p][0]) for p in pending])
        deadline = time.monotonic() + self.timeout
        try:
            while pending:
                batch = consumer.consume(num_messages=1000, timeout=0.5)
                for msg in batch:
                    if (err := msg.error()) is not None:  # partition EOF events are off: a real error
                        raise self._fail(err)
                    p, o = msg.partition(), msg.offset()
                    if p is not None and o is not None and o < ranges[p][1]:  # newer ones: the next scan
                        raw = msg.headers() or []
                        pairs = raw.items() if isinstance(raw, dict) else raw
                        headers = tuple((k, v.encode() if isinstance(v, str) else v or b"") for k, v in pairs)
                        out.append(DeadLetter(p, o, msg.key(), msg.value(), msg.timestamp()[1], headers))
                if batch:
                    deadline = time.monotonic() + self.timeout  # bounded without progress, not in total
                # The position, not the last offset seen: offsets may have gaps (compaction, control records).
                for tp in consumer.position([TopicPartition(self.topic, p) for p in pending]):
                    if tp.offset >= pending[tp.partition]:
                        del pending[tp.partition]
                if pending and time.monotonic() > deadline:
                    raise self._fail(f"no progress for {self.timeout:g} s on partitions {sorted(pending)}")
        finally:
            consumer.unassign()
        return out

    def commit(self, offsets: dict[int, int]) -> None:
        tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            ok = not tps or not any(tp.error for tp in self._consumer.commit(offsets=tps, asynchronous=False))
        except KafkaException:
            ok = False
        if not ok:  # only a bookmark: the markers are written already, so the next scan merely reads more
            log.warning("could not commit the scan position of the dead-letter topic %s", self.topic)


def _at(position: Position) -> str:
    return f"{position[0]}:{position[1]}"


def _reason(exc: KafkaException | KafkaError | str | None) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)


def refused_writes(settings: Settings, errors: Iterable[KafkaError | None], topic: str) -> None:
    """Raise the grant to make when Kafka refused a write of the dead-letter tools for a missing right (Write
    on ``topic``, or the idempotent producer's): a denial is not a record that failed."""
    denied = authorization_refusal(settings, [e for e in errors if e is not None], topic=topic)
    if denied is not None:
        raise denied
