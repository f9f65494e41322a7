"""The dead-letter path: an event that cannot be published as it is goes to the dead-letter topic with its
reason and every field that could be read of it; a dead letter too large for Kafka goes reduced, so that one
always fits; and the poison-flood brake stops the run when too many come too fast.

Owns the counts by reason, the brake's window (``max_dead_letters`` within ``dead_letter_window``) and the
error that stops the run at the end of the current source transaction. Gets the settings, the sink (the
topic's limit), the :class:`~cdc.stream.sender.Sender`, the source transaction being read, and
``ensure_topic`` (which waits, with backoff, for a dead-letter topic that is not there yet).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc.config import Settings
from cdc.errors import (
    CdcError,
    DeadLetterFloodError,
    DeliveryError,
    EventError,
    EventTooLargeError,
    MalformedEventError,
)
from cdc.logs import shown
from cdc.stream.checkpoint import SourceTransaction
from cdc.stream.refusals import error_text
from cdc.stream.route import OutboxEvent, parse_headers
from cdc.stream.sender import Sender
from cdc.stream.sink import DeliveryCallback, Headers, KafkaSink

if TYPE_CHECKING:
    from cdc.stream.spans import RelaySpans

log = logging.getLogger("cdc.pipeline")
# At DEBUG, one line per delivery report: where each event went (id, topic, partition, offset; no payload).
delivery_log = logging.getLogger("cdc.delivery")

# A dead-letter record too large for Kafka is sent reduced: what is left of it always fits.
REDUCED_HEADER = "cdc_reduced"
REDUCED_NOTE = b"the record was too large: key cut to 256 bytes, value and row headers left out"
REDUCED_KEY_BYTES = 256
REDUCED_HEADER_BYTES = 1024


class DeadLetters:
    def __init__(
        self,
        settings: Settings,
        sink: KafkaSink,
        sender: Sender,
        current: SourceTransaction,
        *,
        ensure_topic: Callable[[str], None],
        extra_headers: Headers,
        trace: bool,
        spans: RelaySpans | None = None,
    ) -> None:
        self._settings = settings
        self._sink = sink
        self._sender = sender
        self._current = current
        self._ensure_topic = ensure_topic
        self._extra_headers = extra_headers
        self._trace = trace
        self._spans = spans
        self.by_reason: defaultdict[str, int] = defaultdict(int)
        limit = settings.max_dead_letters
        self._times: deque[float] | None = deque(maxlen=limit) if limit else None
        self.flood: DeadLetterFloodError | None = None  # stops the run once the source transaction is whole

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def in_window(self) -> int:
        """The brake's count: dead letters within the last dead_letter_window (0 when off). Read from the
        metrics thread: a copy, since the stream's thread appends meanwhile."""
        if self._times is None:
            return 0
        since = time.monotonic() - self._settings.dead_letter_window
        return sum(1 for t in tuple(self._times) if t >= since)

    def event(self, event: OutboxEvent, exc: EventError, original_topic: str) -> None:
        if self._settings.on_invalid_event == "stop":
            raise exc
        log.warning(
            "event %s (%s v%d) goes to the dead-letter topic %s: %s",
            shown(event.id),
            shown(event.event_type),
            event.schema_version,
            self._settings.dlq_topic,
            exc.reason,
        )
        headers: Headers = self._headers(exc, original_topic, event.id)
        headers += [
            ("event_type", event.event_type.encode()),
            ("schema_version", str(event.schema_version).encode()),
            ("aggregate_type", event.aggregate_type.encode()),
        ]
        payload = None if isinstance(exc, EventTooLargeError) else event.payload
        self._send(
            exc.reason, event.aggregate_id, payload, headers, self._traced(list(event.headers), event.id, exc)
        )

    def raw(self, exc: MalformedEventError, salvaged: dict[str, bytes]) -> None:
        """A change that is no valid event, dead-lettered with every field that could be read of it (key,
        payload, id, types, headers): the outbox may be pruned before anyone looks."""
        if self._settings.on_invalid_event == "stop":
            raise exc
        event_id = salvaged.get("id", b"").decode(errors="replace")
        log.warning(
            "a malformed outbox change (event %s) goes to the dead-letter topic %s: %s",
            shown(event_id) if event_id else "without an id",
            self._settings.dlq_topic,
            exc,
        )
        headers = self._headers(exc, "", event_id)
        headers += [
            (f, salvaged[f]) for f in ("event_type", "schema_version", "aggregate_type") if f in salvaged
        ]
        raw_headers = salvaged.get("headers")
        row_headers: Headers = list(parse_headers(raw_headers)) if raw_headers is not None else []
        row_headers = self._traced(row_headers, event_id, exc)
        self._send(exc.reason, salvaged.get("aggregate_id"), salvaged.get("payload"), headers, row_headers)

    def _traced(self, row_headers: Headers, event_id: str, exc: EventError) -> Headers:
        """With tracing on, the dead letter's own span (an error, with the reason), whose context the dead
        letter carries in place of the row's."""
        spans, txn = self._spans, self._current.txn
        if spans is None or txn is None:
            return row_headers
        return spans.dead_lettered(
            row_headers, self._settings.dlq_topic, event_id, exc.reason, txn.commit_time_us
        )

    def _headers(self, exc: EventError, original_topic: str, event_id: str) -> Headers:
        current = self._current
        return [
            ("error_class", type(exc).__name__.encode()),
            ("error_reason", exc.reason.encode()),
            ("error_message", exc.message.encode()),
            ("original_topic", original_topic.encode()),
            ("commit_lsn", current.lsn),
            ("xid", current.xid),
            ("commit_time", _iso_ms(current.ts_ms)),
            ("id", event_id.encode()),
            *self._extra_headers,
        ]

    def _send(
        self, reason: str, key: bytes | None, value: bytes | None, headers: Headers, row_headers: Headers
    ) -> None:
        """The dead-letter record: ``headers`` (ours: reason, id, types), then the event's own. When even
        that is too large (a huge key or row headers), a reduced record goes instead, one that always fits:
        the key cut short, no value, no row headers, every header value cut short, and a note of what is
        missing. Counted once handed over. Its Kafka timestamp is now, not the commit's (which is in the
        `commit_time` header): a topic that refuses old timestamps (message.timestamp.before.max.ms) refused
        the event for its commit time, and must not refuse its dead letter for the same reason."""
        now_ms = time.time_ns() // 1_000_000
        txn = self._current.txn
        if txn is None:
            raise CdcError("a dead-letter event arrived outside a transaction")
        topic = self._settings.dlq_topic
        self._ensure_topic(topic)
        on_delivery: DeliveryCallback = txn.delivered
        if self._trace:
            on_delivery = traced(on_delivery, next((v for k, v in headers if k == "id"), None))
        full = headers + row_headers
        sender = self._sender
        try:
            if sender.refusal(topic, key, value, full, self._sink.record_limit(topic)):
                raise EventTooLargeError("the dead letter does not fit the dead-letter topic")
            sender.send(topic, key, value, full, on_delivery, now_ms)
        except EventTooLargeError:
            reduced: Headers = [(k, v[:REDUCED_HEADER_BYTES] if v else v) for k, v in headers]
            reduced.append((REDUCED_HEADER, REDUCED_NOTE))
            short_key = key[:REDUCED_KEY_BYTES] if key else key
            if sender.refusal(topic, short_key, None, [], None):
                raise DeliveryError(
                    f"the dead-letter topic {topic} refuses even a reduced dead letter: check its settings"
                ) from None
            sender.send(topic, short_key, None, reduced, on_delivery, now_ms)
        txn.sent()
        self.by_reason[reason] += 1
        if self._times is not None:
            self._brake(self._times)

    def _brake(self, times: deque[float]) -> None:
        """The poison-flood brake: ``max_dead_letters`` (the deque's length) within ``dead_letter_window``
        seconds, and the run stops once this source transaction is whole (at its Commit): stopping inside
        it would replay it after every restart, so a transaction of more bad events than the limit would
        never be confirmed."""
        now = time.monotonic()
        times.append(now)
        window = self._settings.dead_letter_window
        if self.flood is not None or len(times) < (times.maxlen or 0) or now - times[0] > window:
            return
        self.flood = DeadLetterFloodError(
            f"{len(times)} dead letters within {now - times[0]:.1f} s (max_dead_letters = {len(times)} per "
            f"dead_letter_window = {window:g} s): stopped after confirming what Kafka acknowledged; "
            f"`cdc dlq list` shows them in {self._settings.dlq_topic}"
        )
        log.error(
            "poison-flood brake: %d dead letters within %.1f s; stopping at the end of transaction %s",
            len(times),
            now - times[0],
            self._current.xid.decode(),
        )


def _iso_ms(epoch_ms: int) -> bytes:
    """A commit time (ms since the Unix epoch) as ISO-8601 UTC, for the dead letter's `commit_time`."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").encode()


def traced(delivered: DeliveryCallback, event_id: str | bytes | None) -> DeliveryCallback:
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
