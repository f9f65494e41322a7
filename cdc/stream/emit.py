"""One event to one record: route, encode, headers, produce; or, when it cannot be, its dead letter.

Owns what every record of the source transaction being read carries (its commit LSN and xid as header
bytes, its commit time as the Kafka timestamp, set at each Begin) and the headers added after the
pipeline's own (`cdc outbox republish` marks its copies). The hot path's common case is here: a cached
route, one encode, one produce, no call more per event. Used by the stream loop
(:mod:`cdc.stream.stream_loop`) and by `cdc outbox republish`, which feeds it rows from the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from cdc.errors import CdcError, EventError, EventTooLargeError, MalformedEventError
from cdc.stream.checkpoint import SourceTransaction, Transaction
from cdc.stream.deadletters import DeadLetters, delivery_log, traced
from cdc.stream.messages import LogicalMessage, Values
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import EventRouter, RowFields, event_from_fields, parse_headers
from cdc.stream.routes import Routes
from cdc.stream.sender import Sender
from cdc.stream.sink import Headers, KafkaSink, ProducerStoppedError
from cdc.trace_context import SAMPLED_LAST, TRACEPARENT

if TYPE_CHECKING:
    from cdc.stream.spans import RelaySpans

log = logging.getLogger("cdc.pipeline")


class Emitter:
    def __init__(
        self,
        router: EventRouter,
        routes: Routes,
        sink: KafkaSink,
        sender: Sender,
        dead_letters: DeadLetters,
        refusals: RefusalLedger,
        current: SourceTransaction,
        *,
        keep_alive: Callable[[], None],
        fail: Callable[[], NoReturn],
        extra_headers: Headers,
        spans: RelaySpans | None = None,
    ) -> None:
        self._router = router
        self._routes = routes
        self._cache = routes.cache
        self._produce = sink.produce
        self._sender = sender
        self._dead_letters = dead_letters
        self._refusals = refusals
        self._current = current
        self._keep_alive = keep_alive
        self._fail = fail
        self._extra_headers = extra_headers
        self._published = routes.published
        self._spans = spans  # None: tracing is off, and it costs one test per event
        # Decided once: the hot path must not pay for a closure per event when nobody reads the lines.
        self._trace = delivery_log.isEnabledFor(logging.DEBUG)
        # The source transaction being read (copies of the shared holder's, read per event).
        self._txn: Transaction | None = None
        self._lsn = b""
        self._xid = b""
        self._ts_ms = 0

    def begin(self, txn: Transaction, lsn: bytes, xid: bytes, ts_ms: int) -> None:
        """A source transaction's Begin: what its records carry."""
        self._txn, self._lsn, self._xid, self._ts_ms = txn, lsn, xid, ts_ms
        self._current.begin(txn, lsn, xid, ts_ms)

    def end(self) -> None:
        """Its Commit (or the session's end): no record belongs to it any more."""
        self._txn = None
        self._current.txn = None

    def insert(self, values: Values) -> None:
        """An outbox row on the Python path: its fields, or its dead letter when it has none."""
        try:
            fields = self._router.row_fields(values)
        except MalformedEventError as exc:
            self._dead_letters.raw(exc, self._router.salvage(values))
            return
        self.row(fields)

    def message(self, message: LogicalMessage) -> None:
        """A transactional `outbox` logical message inside a source transaction."""
        router = self._router
        try:
            fields = router.message_fields(message.content)
        except MalformedEventError as exc:
            self._dead_letters.raw(exc, router.salvage_message(message.content))
            return
        id_, aggregate_type, aggregate_id, event_type, version, _, headers = fields
        if self._routes.encoder.reads_exactly(event_type.decode(), int(version)):  # a decimal: its digits
            payload = router.exact_payload(message.content)
            fields = (id_, aggregate_type, aggregate_id, event_type, version, payload, headers)
        self.row(fields)

    def row(self, fields: RowFields) -> None:
        """One event (a row or a message): encode and produce it, with a cached (topic, encoder) route."""
        txn = self._txn
        if txn is None:
            raise CdcError("an outbox event arrived outside a transaction")
        id_, aggregate_type, aggregate_id, event_type, version, payload, raw_headers = fields
        route = self._cache.get((aggregate_type, event_type, version))
        try:
            if route is None:
                route = self._routes.route(aggregate_type, event_type, version)
            topic, encode, series, limit = route
            value = encode(payload)
        except EventError as exc:
            topic_meant = self._routes.topic_or_none(aggregate_type, event_type)
            self._dead_letters.event(event_from_fields(fields), exc, topic_meant)
            return
        headers: Headers = [
            ("id", id_),
            ("event_type", event_type),
            ("schema_version", version),
            ("aggregate_type", aggregate_type),
            ("commit_lsn", self._lsn),
            ("xid", self._xid),
        ]
        if self._extra_headers:
            headers.extend(self._extra_headers)  # `cdc outbox republish`'s mark
        row_headers = None
        if raw_headers is not None:
            row_headers = parse_headers(raw_headers)
            headers.extend(row_headers)
        on_delivery = traced(txn.delivered, id_) if self._trace else txn.delivered
        careful = limit is not None or self._refusals.active
        if careful:
            refusal = self._sender.refusal(topic, aggregate_id, value, headers, limit)
            if refusal is not None:
                self._dead_letters.event(event_from_fields(fields), refusal, topic)
                return
        spans = self._spans
        span = None
        wanted = spans is not None and (row_headers or spans.always)
        if wanted and row_headers:
            # At 1 % sampling, 99 rows in 100 carry an unsampled version-00 traceparent: its last byte says so
            # here, without a call (RelaySpans.start tests the rest).
            for header, context in row_headers:  # not `value`: that is the record's
                if header == TRACEPARENT:
                    wanted = not (context and len(context) == 55 and context[54] not in SAMPLED_LAST)
                    break
            else:
                wanted = spans is not None and spans.always  # no traceparent: a span of its own, or none
        if wanted:
            assert spans is not None
            started = spans.start(
                headers,
                row_headers,
                topic,
                aggregate_id,
                id_,
                event_type,
                version,
                self._lsn,
                txn.commit_time_us,
            )
            if started is not None:
                span, headers = started
                on_delivery = spans.delivered(span, on_delivery)
        try:
            if careful:
                self._sender.send(topic, aggregate_id, value, headers, on_delivery)
            else:
                # The common case, without a call more per event. The route's topic was made sure of when
                # the route was cached.
                self._produce(topic, aggregate_id, value, headers, self._ts_ms, on_delivery, self._keep_alive)
        except ProducerStoppedError:
            self._fail()
        except EventTooLargeError as exc:
            if span is not None and spans is not None:
                spans.not_sent(span, exc.reason)  # the dead letter's own span says where it went
            self._dead_letters.event(event_from_fields(fields), exc, topic)
            return
        # Counted once handed over: its delivery report can only come from a later poll().
        txn.sent()
        self._published[series] += 1
