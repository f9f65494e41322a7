"""Sending records: produced as they come, alone when Kafka refused them before, and the dead-letter path.

Every record the pipeline hands to Kafka goes through here, events and dead letters alike: a record for a
topic whose ``max.message.bytes`` is below the producer's limit is checked against it first, and one that
Kafka refused is produced alone (:mod:`cdc.stream.refusals`). An event that cannot be published as it is
goes to the dead-letter topic with its reason and every field that could be read of it; a dead letter too
large for Kafka goes reduced, so that one always fits.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from cdc.errors import (
    CdcError,
    DeadLetterFloodError,
    DeliveryError,
    EventError,
    EventTooLargeError,
    MalformedEventError,
)
from cdc.logs import shown
from cdc.stream.refusals import error_text, record_digest, worst_case_size
from cdc.stream.route import OutboxEvent, parse_headers
from cdc.stream.sink import DeliveryCallback, Headers, ProducerStoppedError
from cdc.stream.waits import Waits

log = logging.getLogger("cdc.pipeline")
# At DEBUG, one line per delivery report: where each event went (id, topic, partition, offset; no payload).
delivery_log = logging.getLogger("cdc.delivery")

# A dead-letter record too large for Kafka is sent reduced: what is left of it always fits.
REDUCED_HEADER = "cdc_reduced"
REDUCED_NOTE = b"the record was too large: key cut to 256 bytes, value and row headers left out"
REDUCED_KEY_BYTES = 256
REDUCED_HEADER_BYTES = 1024


class Delivery(Waits):
    """Producing one record, and dead-lettering one event."""

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        """Produce one record; alone (the queue empty before and after) when Kafka refused it before, so
        that what Kafka says is about this record only. Its timestamp: the commit's, unless given."""
        refusals = self.refusals
        ts = self._txn_ts_ms if timestamp_ms is None else timestamp_ms
        digest = record_digest(topic, key, value) if refusals.active else None
        try:
            if digest is not None and refusals.must_go_alone(digest):
                self._wait_empty()
                self._alone = digest
                self.sink.produce(topic, key, value, headers, ts, on_delivery, self._keep_alive)
                self._wait_empty()
                self._alone = None
                refusals.cleared(digest)
                return
            self.sink.produce(topic, key, value, headers, ts, on_delivery, self._keep_alive)
        except ProducerStoppedError:
            self._delivery_failed()

    def _refusal(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers, limit: int | None
    ) -> EventError | None:
        """Why the record may not be produced: above the topic's limit, or refused by Kafka when alone."""
        if limit is not None:
            raw = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)
            if worst_case_size(raw) > limit:
                return EventTooLargeError(
                    f"the record ({raw} bytes) may be above topic '{topic}''s max.message.bytes ({limit})"
                )
        if self.refusals.active:
            return self.refusals.culprit_error(record_digest(topic, key, value), topic)
        return None

    def _dead_letter(self, event: OutboxEvent, exc: EventError, original_topic: str) -> None:
        if self.settings.on_invalid_event == "stop":
            raise exc
        log.warning(
            "event %s (%s v%d) goes to the dead-letter topic %s: %s",
            shown(event.id),
            shown(event.event_type),
            event.schema_version,
            self.settings.dlq_topic,
            exc.reason,
        )
        headers: Headers = self._dlq_headers(exc, original_topic, event.id)
        headers += [
            ("event_type", event.event_type.encode()),
            ("schema_version", str(event.schema_version).encode()),
            ("aggregate_type", event.aggregate_type.encode()),
        ]
        payload = None if isinstance(exc, EventTooLargeError) else event.payload
        self._send_dead_letter(exc.reason, event.aggregate_id, payload, headers, list(event.headers))

    def _dead_letter_raw(self, exc: MalformedEventError, salvaged: dict[str, bytes]) -> None:
        """A change that is no valid event, dead-lettered with every field that could be read of it (key,
        payload, id, types, headers): the outbox may be pruned before anyone looks."""
        if self.settings.on_invalid_event == "stop":
            raise exc
        event_id = salvaged.get("id", b"").decode(errors="replace")
        log.warning(
            "a malformed outbox change (event %s) goes to the dead-letter topic %s: %s",
            shown(event_id) if event_id else "without an id",
            self.settings.dlq_topic,
            exc,
        )
        headers = self._dlq_headers(exc, "", event_id)
        headers += [
            (f, salvaged[f]) for f in ("event_type", "schema_version", "aggregate_type") if f in salvaged
        ]
        raw_headers = salvaged.get("headers")
        row_headers: Headers = list(parse_headers(raw_headers)) if raw_headers is not None else []
        self._send_dead_letter(
            exc.reason, salvaged.get("aggregate_id"), salvaged.get("payload"), headers, row_headers
        )

    def _dlq_headers(self, exc: EventError, original_topic: str, event_id: str) -> Headers:
        return [
            ("error_class", type(exc).__name__.encode()),
            ("error_reason", exc.reason.encode()),
            ("error_message", exc.message.encode()),
            ("original_topic", original_topic.encode()),
            ("commit_lsn", self._txn_lsn),
            ("xid", self._txn_xid),
            ("commit_time", _iso_ms(self._txn_ts_ms)),
            ("id", event_id.encode()),
            *self._extra_headers,
        ]

    def _send_dead_letter(
        self, reason: str, key: bytes | None, value: bytes | None, headers: Headers, row_headers: Headers
    ) -> None:
        """The dead-letter record: ``headers`` (ours: reason, id, types), then the event's own. When even
        that is too large (a huge key or row headers), a reduced record goes instead, one that always fits:
        the key cut short, no value, no row headers, every header value cut short, and a note of what is
        missing. Counted once handed over. Its Kafka timestamp is now, not the commit's (which is in the
        `commit_time` header): a topic that refuses old timestamps (message.timestamp.before.max.ms) refused
        the event for its commit time, and must not refuse its dead letter for the same reason."""
        now_ms = time.time_ns() // 1_000_000
        txn = self._txn
        if txn is None:
            raise CdcError("a dead-letter event arrived outside a transaction", lsn=self._received)
        topic = self.settings.dlq_topic
        self._ensure_topic(topic)
        on_delivery: DeliveryCallback = txn.delivered
        if self._trace:
            on_delivery = _traced(on_delivery, next((v for k, v in headers if k == "id"), None))
        full = headers + row_headers
        try:
            limit = self.sink.record_limit(topic)
            if (limit is not None or self.refusals.active) and self._refusal(topic, key, value, full, limit):
                raise EventTooLargeError("the dead letter does not fit the dead-letter topic")
            self._send(topic, key, value, full, on_delivery, now_ms)
        except EventTooLargeError:
            reduced: Headers = [(k, v[:REDUCED_HEADER_BYTES] if v else v) for k, v in headers]
            reduced.append((REDUCED_HEADER, REDUCED_NOTE))
            short_key = key[:REDUCED_KEY_BYTES] if key else key
            if self.refusals.active and self.refusals.culprit_error(
                record_digest(topic, short_key, None), topic
            ):
                raise DeliveryError(
                    f"the dead-letter topic {topic} refuses even a reduced dead letter: check its settings",
                    lsn=self._received,
                ) from None
            self._send(topic, short_key, None, reduced, on_delivery, now_ms)
        txn.sent()
        self.dead_lettered_by_reason[reason] += 1
        if self._dead_letter_times is not None:
            self._count_toward_brake(self._dead_letter_times)

    def _count_toward_brake(self, times: deque[float]) -> None:
        """The poison-flood brake: ``max_dead_letters`` (the deque's length) within ``dead_letter_window``
        seconds, and the run stops once this source transaction is whole (pipeline, at its Commit): stopping
        inside it would replay it after every restart, so a transaction of more bad events than the limit
        would never be confirmed."""
        now = time.monotonic()
        times.append(now)
        window = self.settings.dead_letter_window
        if self._flood is not None or len(times) < (times.maxlen or 0) or now - times[0] > window:
            return
        self._flood = DeadLetterFloodError(
            f"{len(times)} dead letters within {now - times[0]:.1f} s (max_dead_letters = {len(times)} per "
            f"dead_letter_window = {window:g} s): stopped after confirming what Kafka acknowledged; "
            f"`cdc dlq list` shows them in {self.settings.dlq_topic}"
        )
        log.error(
            "poison-flood brake: %d dead letters within %.1f s; stopping at the end of transaction %s",
            len(times),
            now - times[0],
            self._txn_xid.decode(),
        )


def _iso_ms(epoch_ms: int) -> bytes:
    """A commit time (ms since the Unix epoch) as ISO-8601 UTC, for the dead letter's `commit_time`."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").encode()


def _traced(delivered: DeliveryCallback, event_id: str | bytes | None) -> DeliveryCallback:
    """``delivered``, with a DEBUG line per report first: grep an event id in the log to see where it went.
    (A delivery report carries no headers, so the id comes with the closure.)"""
    text = shown(event_id)

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivery_log.debug(
                "event %s acknowledged: %s [%d] @ %s", text, msg.topic(), msg.partition(), msg.offset()
            )
        else:
            delivery_log.debug("event %s not delivered to %s: %s", text, msg.topic(), error_text(err))
        delivered(err, msg)

    return on_delivery
