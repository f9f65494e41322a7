"""`cdc dlq replay`: dead letters sent back to their original topics, once their cause is fixed.

A replayed record is encoded again from its payload (the schema may have been added since), produced to its
original topic with the timestamp `cdc run` would have given it (its transaction's commit time, from the
dead letter's `commit_time` header), and marked as resolved in the dead-letter topic once Kafka
acknowledged it (:mod:`cdc.ops.dlq` reads the topic and finds what is unresolved).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, Message, Producer

from cdc.avro.encoder import confluent_header
from cdc.avro.reload import SchemaSet
from cdc.config import Settings
from cdc.errors import (
    AccessDeniedError,
    DeadLetterError,
    EventError,
    MalformedEventError,
    ReservedTopicError,
    SinkError,
)
from cdc.logs import kafka_log, shown
from cdc.ops.dlq import (
    REPLAYED_FROM,
    REPLAYED_TO,
    RESOLVED,
    DeadLetter,
    DeadLetterTopic,
    Position,
    Scan,
    _at,
    _reason,
    refused_writes,
    split_headers,
)
from cdc.stream.kafka_config import producer_config
from cdc.stream.route import KAFKA_INTERNAL_PREFIX, owned_topics
from cdc.stream.sink import Headers, KafkaSink

if TYPE_CHECKING:
    from cdc.avro.registry import SchemaRegistry

__all__ = ["Outcome", "ReplayResult", "replay"]

log = logging.getLogger("cdc.dlq")

_Reports = dict[int, tuple[KafkaError | None, int]]  # n-th record produced -> (error, offset)


@dataclass(frozen=True)
class Outcome:
    """What a replay did to one record: ``topic`` when it was replayed, ``reason`` when it still fails."""

    id: str
    position: Position
    topic: str = ""
    reason: str = ""
    message: str = ""


@dataclass
class ReplayResult:
    outcomes: list[Outcome] = field(default_factory=list)  # in (partition, offset) order

    @property
    def replayed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.reason]

    @property
    def failing(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.reason]


def replay(settings: Settings, ids: Sequence[str], *, replay_all: bool = False) -> ReplayResult:
    """Replay the records named by ``ids`` (or every unresolved one), in (partition, offset) order."""
    with DeadLetterTopic(settings) as dlq:
        scan = dlq.scan()
        chosen = scan.listing() if replay_all else list({r.position: r for r in map(scan.find, ids)}.values())
        replayer = _Replayer(settings, scan)
        try:
            result, markers = replayer.run(sorted(chosen, key=lambda r: r.position))
        finally:
            if replayer.registry is not None:
                replayer.registry.close()
        dlq.commit(scan.resume_offsets(markers))
    return result


class _Replayer:
    def __init__(self, settings: Settings, scan: Scan) -> None:
        # The checked snapshot that `cdc run` starts from: a schemas_dir failing `cdc schemas check` must not
        # publish (or register) through a replay what the pipeline itself would refuse to start with.
        schemas = SchemaSet(settings.schemas_dir, settings.schema_compatibility)
        self.settings, self.scan, store = settings, scan, schemas.store
        self.encoder = schemas.encoder
        confluent = settings.value_format == "confluent"
        self.registry: SchemaRegistry | None = None
        if confluent:
            from cdc.avro.registry import SchemaRegistry  # its HTTP stack only when the framing needs it

            self.registry = SchemaRegistry.from_settings(settings, store)

    def encode(self, record: DeadLetter) -> bytes:
        """The value the pipeline would publish today; an EventError when it still cannot."""
        topic, event_type = record.header("original_topic"), record.header("event_type")
        if record.value is None or not topic:  # too large or malformed: the pipeline kept no payload
            exc = EventError("the dead-letter record has no payload (none is kept for this reason)")
            exc.reason = record.header("error_reason") or "malformed_event"
            raise exc
        owned = owned_topics(self.settings)
        if topic in owned or topic.startswith(KAFKA_INTERNAL_PREFIX):
            raise ReservedTopicError(f"its original topic {shown(topic)} is one the pipeline or Kafka owns")
        try:
            version = int(record.header("schema_version"))
        except ValueError:
            raise MalformedEventError("header schema_version is not an integer") from None
        encode = self.encoder.encoder_for(event_type, version)  # a missing schema file is the event's fault
        if self.registry is not None:
            schema_id = self.registry.schema_id(topic, event_type, version)
            encode = self.encoder.encoder_for(event_type, version, header=confluent_header(schema_id))
        return encode(record.value)

    def run(self, chosen: list[DeadLetter]) -> tuple[ReplayResult, dict[int, list[int]]]:
        result, ready = ReplayResult(), list[tuple[DeadLetter, str]]()
        sink, reports, failure = KafkaSink(self.settings), _Reports(), ""
        for record in chosen:
            topic, at = record.header("original_topic"), f"{self.settings.dlq_topic}:{_at(record.position)}"
            try:
                value = self.encode(record)
                headers: Headers = [*split_headers(record.headers)[0], (REPLAYED_FROM, at.encode())]
                sink.ensure_topic(topic)  # a schema_not_found event never had its topic made
                done = _on(reports, len(ready))
                sink.produce(topic, record.key, value, headers, commit_ms(record), done, lambda: None)
                ready.append((record, topic))
            except EventError as exc:  # still the event's fault (too large included): it stays
                result.outcomes.append(Outcome(record.id, record.position, "", exc.reason, exc.message))
            except SinkError as exc:  # infrastructure (registry down, topic missing): stop here
                failure = f"replaying {shown(record.id)} failed: {exc}"
                break
        # Flushed and judged even after a failure: what Kafka acknowledged is marked, not published twice.
        acked = self._acked(sink.flush, reports, len(ready))
        delivered = [sent for sent, offset in zip(ready, acked, strict=True) if offset is not None]
        result.outcomes += [Outcome(record.id, record.position, topic) for record, topic in delivered]
        if lost := len(ready) - len(delivered):
            failure = failure or f"Kafka did not acknowledge {lost} replayed records: {_first(reports)}"
        markers = self._mark(delivered)
        for i, (err, _) in sorted(reports.items()):
            if err is not None:  # a missing right is no record's failure: the grant, after the markers
                refused_writes(self.settings, [err], ready[i][1])
        if failure:
            raise DeadLetterError(f"{failure}; not marked resolved ({len(delivered)} others were replayed)")
        result.outcomes.sort(key=lambda o: o.position)
        return result, markers

    def _mark(self, delivered: list[tuple[DeadLetter, str]]) -> dict[int, list[int]]:
        """Resolve every copy of each delivered record; returns the markers' offsets per partition."""
        if not delivered:
            return {}
        producer = Producer({**producer_config(self.settings), "logger": kafka_log})
        reports, targets, dlq = _Reports(), list[Position](), self.settings.dlq_topic
        for record, topic in delivered:
            rid, to = record.id.encode(), topic.encode()
            for copy in self.scan.copies(record):
                headers: Headers = [(RESOLVED, _at(copy.position).encode()), ("id", rid), (REPLAYED_TO, to)]
                # Into the record's own partition: resume_offset's safety rests on it.
                done = _on(reports, len(targets))
                producer.produce(dlq, None, None, copy.partition, on_delivery=done, headers=headers)
                targets.append(copy.position)
        markers: defaultdict[int, list[int]] = defaultdict(list)
        for target, offset in zip(targets, self._acked(producer.flush, reports, len(targets)), strict=True):
            if offset is not None:
                self.scan.resolved.add(target)
                markers[target[0]].append(offset)
        if unmarked := [_at(t) for t in targets if t not in self.scan.resolved]:
            try:
                refused_writes(self.settings, (err for err, _ in reports.values()), dlq)
            except AccessDeniedError as denied:
                raise AccessDeniedError(
                    f"{denied.message}. Dead-letter records {', '.join(unmarked)} were replayed but could "
                    "not be marked resolved: a later replay publishes them again",
                    right=denied.right,
                ) from None
            raise DeadLetterError(
                f"dead-letter records {', '.join(unmarked)} were replayed but could not be marked resolved "
                f"({_first(reports)}): a later replay publishes them again"
            )
        return markers

    def _acked(self, flush: Callable[[float], int], reports: _Reports, n: int) -> list[int | None]:
        """After producing ``n`` records: the offset of each one Kafka acknowledged, None for the others."""
        flush(self.settings.delivery_timeout + 5)  # by then the producer has timed out what it could not send
        return [r[1] if (r := reports.get(i)) is not None and r[0] is None else None for i in range(n)]


def commit_ms(record: DeadLetter) -> int:
    """The timestamp `cdc run` gives the event's record: its transaction's commit time (ms), which the dead
    letter keeps in its `commit_time` header (its own timestamp is when it was written). A dead letter
    without a readable one (written by hand, or cut short) keeps its own."""
    try:
        stamp = datetime.fromisoformat(record.header("commit_time"))
    except ValueError:
        return record.timestamp_ms
    if stamp.tzinfo is None:  # the pipeline writes UTC with its offset; anything else is no commit time of it
        return record.timestamp_ms
    return (stamp - _EPOCH) // timedelta(milliseconds=1)  # exact: a float's product may fall 1 ms short


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _on(reports: _Reports, i: int) -> Callable[[KafkaError | None, Message], None]:
    def delivered(err: KafkaError | None, msg: Message) -> None:
        reports[i] = (err, (msg.offset() or 0) if err is None else -1)

    return delivered


def _first(reports: _Reports) -> str:
    return next((_reason(e) for e, _ in reports.values() if e is not None), "no delivery report in time")
