"""`cdc dlq discard`: dead letters resolved without a replay, with who and why on record.

Like Symfony Messenger's ``messenger:failed:remove``: an event that nobody will ever publish (a test row, an
event type that was given up, a payload its producer sent again fixed) leaves the list of what is unresolved.
Kafka cannot delete it, so a *marker* goes to the dead-letter topic as for a replay (:mod:`cdc.ops.dlq`), one
per copy of the record, saying ``discarded_by`` (``--by``, or the OS user) and ``discard_reason``; ``cdc dlq
show`` displays it. Nothing is published anywhere else.
"""

from __future__ import annotations

import getpass
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, Message, Producer

from cdc.config import Settings
from cdc.errors import DeadLetterError
from cdc.logs import kafka_log, shown
from cdc.ops.dlq import (
    DISCARD_REASON,
    DISCARDED_BY,
    RESOLVED,
    DeadLetter,
    DeadLetterTopic,
    Position,
    _at,
    refused_writes,
)
from cdc.ops.dlq import _reason as reason_of
from cdc.stream.kafka_config import producer_config
from cdc.stream.sink import Headers

__all__ = ["discard", "who"]

log = logging.getLogger("cdc.dlq")

MAX_REASON = 1000  # characters of --reason kept in the marker: a header, not a document


def who() -> str:
    """The OS user running the command (a container may have no name for its uid)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def discard(settings: Settings, ids: Sequence[str], *, reason: str, by: str) -> list[DeadLetter]:
    """Mark the records named by ``ids`` resolved, every copy of each; returns them in (partition, offset)
    order. Nothing is marked unless every ID is an unresolved record."""
    reason, by = reason.strip()[:MAX_REASON], by.strip()
    if not reason:
        raise DeadLetterError("a discard needs a reason (--reason): it is recorded with the marker")
    if not by:
        raise DeadLetterError("a discard needs someone who does it (--by, or the OS user)")
    with DeadLetterTopic(settings) as dlq:
        scan = dlq.scan()
        chosen = sorted({r.position: r for r in map(scan.find, ids)}.values(), key=lambda r: r.position)
        targets: list[tuple[Position, Headers]] = []
        for record in chosen:
            extra: Headers = [("id", record.id.encode()), (DISCARDED_BY, by.encode())]
            extra.append((DISCARD_REASON, reason.encode()))
            targets += [
                ((c.partition, c.offset), [(RESOLVED, _at(c.position).encode()), *extra])
                for c in scan.copies(record)
            ]
        markers = _mark(settings, targets)
        scan.resolved.update(target for target, _ in targets)
        dlq.commit(scan.resume_offsets(markers))
    for record in chosen:
        log.info("discarded dead letter %s by %s", shown(record.id), by)
    return chosen


def _mark(settings: Settings, targets: list[tuple[Position, Headers]]) -> dict[int, list[int]]:
    """Produce the markers, each into its record's partition (resume_offset relies on it); the offsets
    Kafka gave them, per partition. Any marker that Kafka did not acknowledge is an error: what was marked
    stays marked, the rest stays unresolved, and a second discard finishes the job."""
    producer = Producer({**producer_config(settings), "logger": kafka_log})
    reports: dict[int, tuple[KafkaError | None, int]] = {}

    def on(i: int) -> Callable[[KafkaError | None, Message], None]:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            reports[i] = (err, (msg.offset() or 0) if err is None else -1)

        return delivered

    for i, ((partition, _), headers) in enumerate(targets):
        producer.produce(settings.dlq_topic, None, None, partition, on_delivery=on(i), headers=headers)
    producer.flush(settings.delivery_timeout + 5)
    markers: defaultdict[int, list[int]] = defaultdict(list)
    failed: list[str] = []
    for i, ((partition, offset), _) in enumerate(targets):
        err, at = reports.get(i, (None, -1))
        if err is None and at >= 0:
            markers[partition].append(at)
        else:
            failed.append(f"{partition}:{offset} ({reason_of(err) if err else 'no delivery report in time'})")
    if failed:
        refused_writes(settings, (err for err, _ in reports.values()), settings.dlq_topic)
        raise DeadLetterError(f"dead-letter records {', '.join(failed)} could not be marked discarded")
    return markers
