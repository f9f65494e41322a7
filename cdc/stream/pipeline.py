"""The hot loop: read from the slot, decode, route, encode, produce; with ack-gated checkpoints.

One thread does everything that touches Python objects: it reads CopyData from the replication connection,
decodes, encodes, produces, and serves Kafka's delivery reports inside ``poll()``. librdkafka's own threads do
the network I/O to Kafka, and PostgreSQL's walsender decodes WAL in its own process, so the three stages
overlap without a lock on our side.

What may be confirmed to the slot is decided by :class:`cdc.stream.checkpoint.AckTracker` alone; the
pipeline sends its watermark in standby status updates at least every ``status_interval`` and whenever it
moves. Its parts: :mod:`cdc.stream.lifecycle` (start, reconnect, replay, shutdown), :mod:`cdc.stream.delivery`
(sending, dead letters), :mod:`cdc.stream.waits` (waiting without losing the slot).
"""

from __future__ import annotations

import logging
import time

from cdc.avro.encoder import confluent_header
from cdc.errors import (
    AggregateTypeNotAllowedError,
    CdcError,
    EventError,
    EventTooLargeError,
    InvalidTopicError,
    MalformedEventError,
    RegistryUnavailableError,
    SchemaNotFoundError,
    format_lsn,
)
from cdc.stream.delivery import _traced
from cdc.stream.heartbeat import PREFIX as HEARTBEAT_PREFIX
from cdc.stream.lifecycle import Lifecycle
from cdc.stream.messages import (
    Begin,
    Commit,
    Delete,
    Keepalive,
    LogicalMessage,
    Relation,
    Truncate,
    Update,
    Values,
)
from cdc.stream.pgoutput import decode, decode_copy_data, decode_insert_tuple
from cdc.stream.route import MESSAGE_PREFIX, Route, RowFields, event_from_fields, parse_headers
from cdc.stream.sink import Headers, ProducerStoppedError
from cdc.stream.source import MAX_BATCH, ReplicationSource
from cdc.stream.waits import STATUS_MIN_INTERVAL, StopRequested

log = logging.getLogger("cdc.pipeline")

READ_TIMEOUT = 0.2  # seconds: how long one read waits for the database, which bounds the reaction to SIGTERM
# The stream has had more waiting at every read for this long: the pipeline drains a backlog (exactly-once
# then commits less often, cdc.stream.transactions.KafkaTransaction.due).
DRAINING_AFTER = 1.0

# The route cache and the metric series are keyed by values the rows bring: bounded, so that a stream of new
# aggregate types (a bug upstream, or an allow-list left off) cannot grow the process without end.
MAX_ROUTES = 10_000
MAX_TOPIC_SERIES = 1_000
OTHER_TOPICS = "(other topics)"


class Pipeline(Lifecycle):
    """``Pipeline(settings).run()``: stream the outbox into Kafka until a stop is requested."""

    def _stream(self, source: ReplicationSource) -> None:
        tracker = self.tracker
        router = self.router
        outbox_insert = self._outbox_insert
        outbox_row = self._outbox_row
        poll = self.sink.poll
        status_interval = self.settings.status_interval
        heartbeat = self.heartbeat
        slot_watch = self.slot_watch
        ktx = self.ktx
        while not self._stop:
            batch = source.read(READ_TIMEOUT)
            if len(batch) < MAX_BATCH:  # the read emptied what the server had sent: caught up
                self._caught_up = time.monotonic()
            last_wal = None
            for data in batch:
                if data[0] == 0x77:  # 'w' XLogData: 1 tag byte + 24 bytes of envelope, then pgoutput
                    last_wal = data
                    if data[25] == 0x49:  # 'I': the common case, decoded without the generic dispatch
                        read_row = router.row_reader
                        fields = None if read_row is None else read_row(data)
                        if fields is not None:
                            outbox_row(fields)
                        else:  # the Python path: no compiled reader, or a row it left to this code
                            oid, values = decode_insert_tuple(data, offset=25)
                            if oid == router.outbox_oid:
                                outbox_insert(values)
                    else:
                        self._handle(decode(data[25:]))
                else:
                    keepalive = decode_copy_data(data)
                    if isinstance(keepalive, Keepalive):
                        if self._verify is not None and self._txn is None:
                            self._passed_checkpoint(keepalive.wal_end)  # exactly-once, a provisional skip
                        self.server_wal_end = keepalive.wal_end
                        tracker.keepalive(keepalive.wal_end)
                        if heartbeat.by_keepalive:
                            heartbeat.keepalive(keepalive.wal_end)
                        if keepalive.wal_end > self._received and tracker.idle:
                            self._received = keepalive.wal_end
                        if keepalive.reply_requested:
                            self._send_status()
            now = time.monotonic()
            self._turned(now)
            if last_wal is not None:
                self._received = max(self._received, int.from_bytes(last_wal[1:9], "big"))
                self.server_wal_end = int.from_bytes(last_wal[9:17], "big")
                self._last_data = now
            elif heartbeat.due(now, self._last_data):
                heartbeat.emit(now)
            if slot_watch.due(now):
                slot_watch.look(now)
            poll(0)
            if self._reload_requested:
                self._reload_requested = False
                self._reload_schemas()
            if tracker.failure is not None or self.sink.fatal_error is not None:
                self._delivery_failed()
            if ktx.open and self._txn is None and ktx.due(now, draining=self._draining(now)):
                self._commit_kafka()  # exactly-once: a quiet stream commits what it has
            # Status updates: whenever the watermark moved, but not more often than STATUS_MIN_INTERVAL
            # (at tens of thousands of events a second it moves with every batch), and at least every
            # status_interval so the server does not take us for dead.
            since = now - source.last_status_at
            if since >= status_interval or (
                self._confirmable() != self._sent_confirmed and since >= STATUS_MIN_INTERVAL
            ):
                self._send_status()

    def _draining(self, now: float) -> bool:
        return now - self._caught_up > DRAINING_AFTER

    def _outbox_insert(self, values: Values) -> None:
        if self._skipping:
            return  # exactly-once: a source transaction that a committed Kafka transaction already holds
        try:
            fields = self.router.row_fields(values)
        except MalformedEventError as exc:
            self._dead_letter_raw(exc, self.router.salvage(values))
            return
        self._emit(fields)

    def _outbox_row(self, fields: RowFields) -> None:
        if not self._skipping:  # exactly-once: a source transaction that a committed Kafka transaction holds
            self._emit(fields)

    def _emit(self, fields: RowFields) -> None:
        """One event (a row or a message): encode and produce it, with a cached (topic, encoder) route."""
        txn = self._txn
        if txn is None:
            raise CdcError("an outbox event arrived outside a transaction", lsn=self._received)
        id_, aggregate_type, aggregate_id, event_type, version, payload, raw_headers = fields
        route = self._routes.get((aggregate_type, event_type, version))
        try:
            if route is None:
                route = self._route_for(aggregate_type, event_type, version)
            topic, encode, series, limit = route
            value = encode(payload)
        except EventError as exc:
            self._dead_letter(event_from_fields(fields), exc, self._topic_or_none(aggregate_type, event_type))
            return
        headers: Headers = [
            ("id", id_),
            ("event_type", event_type),
            ("schema_version", version),
            ("aggregate_type", aggregate_type),
            ("commit_lsn", self._txn_lsn),
            ("xid", self._txn_xid),
        ]
        if self._extra_headers:
            headers.extend(self._extra_headers)  # `cdc outbox republish`'s mark
        if raw_headers is not None:
            headers.extend(parse_headers(raw_headers))
        on_delivery = _traced(txn.delivered, id_) if self._trace else txn.delivered
        careful = limit is not None or self.refusals.active
        if careful:
            refusal = self._refusal(topic, aggregate_id, value, headers, limit)
            if refusal is not None:
                self._dead_letter(event_from_fields(fields), refusal, topic)
                return
        try:
            if careful:
                self._send(topic, aggregate_id, value, headers, on_delivery)
            else:
                # The common case, without a call more per event. The route's topic was made sure of when
                # the route was cached.
                self.sink.produce(
                    topic, aggregate_id, value, headers, self._txn_ts_ms, on_delivery, self._keep_alive
                )
        except ProducerStoppedError:
            self._delivery_failed()
        except EventTooLargeError as exc:
            self._dead_letter(event_from_fields(fields), exc, topic)
            return
        # Counted once handed over: its delivery report can only come from a later poll().
        txn.sent()
        self.published_by_topic[series] += 1

    def _route_for(self, aggregate_type: bytes, event_type: bytes, version: bytes) -> Route:
        """Topic and bound encoder of one (aggregate type, event type, version); cached when it works."""
        try:
            at, et = aggregate_type.decode(), event_type.decode()
        except UnicodeDecodeError:
            raise InvalidTopicError(
                "the aggregate type or event type is not UTF-8: it makes no topic"
            ) from None
        allowed = self.settings.aggregate_types
        if allowed is not None and at not in allowed:
            raise AggregateTypeNotAllowedError(
                f"aggregate type {at[:60]!r} is not in the aggregate_types allow-list"
            )
        v = int(version)
        topic = self.router.topic(at, et)
        try:  # the schema first: a missing one is the event's fault, once schemas_dir was re-read
            encode = self.encoder.encoder_for(et, v)
        except SchemaNotFoundError:
            self._reload_schemas((et, v))
            encode = self.encoder.encoder_for(et, v)  # or the error again, saying what the re-read found
        if self.registry is not None:
            encode = self.encoder.encoder_for(et, v, header=confluent_header(self._schema_id(topic, et, v)))
        self._ensure_topic(topic)
        limit = self.sink.record_limit(topic)
        if limit is not None and not self.sink.batches_fit(limit):
            if self.exactly_once:
                self._shrink_batches_mid_transaction(topic, limit)  # raises: a restart from the checkpoint
            self._wait_empty()
            self.sink.shrink_batches(limit)
        routes = self._routes
        if len(routes) >= MAX_ROUTES:
            del routes[next(iter(routes))]  # the oldest: a route is cheap to make again
        published = self.published_by_topic
        series = topic if topic in published or len(published) < MAX_TOPIC_SERIES else OTHER_TOPICS
        published.setdefault(series, 0)
        route = routes[(aggregate_type, event_type, version)] = (topic, encode, series, limit)
        return route

    def _topic_or_none(self, aggregate_type: bytes, event_type: bytes) -> str:
        """The topic a dead-lettered event was meant for, or "" when its names make none."""
        try:
            return self.router.topic(aggregate_type.decode(), event_type.decode())
        except (InvalidTopicError, UnicodeDecodeError):
            return ""

    def _schema_id(self, topic: str, event_type: str, version: int) -> int:
        """The registry's id for the schema; while the registry is down the event waits, with backoff."""
        registry = self.registry
        assert registry is not None
        return self._waiting(
            lambda: registry.schema_id(topic, event_type, version),
            RegistryUnavailableError,
            f"the schema registry answers again ({event_type} v{version})",
        )

    def _handle(self, message: object) -> None:
        if isinstance(message, Begin):
            self._txn = self.tracker.begin(message.xid, message.final_lsn, message.commit_time_us)
            self._txn_lsn = format_lsn(message.final_lsn).encode()
            self._txn_xid = str(message.xid).encode()
            self._txn_ts_ms = message.commit_time_us // 1000
            if self.exactly_once:
                self._begin_source_transaction(message.final_lsn)
        elif isinstance(message, Commit):
            txn = self._txn
            if txn is None:
                raise CdcError("Commit without Begin on the replication stream", lsn=message.end_lsn)
            self._txn = None
            self.tracker.commit(txn, message.end_lsn)
            if self._verify is not None:  # exactly-once: is the skip below the checkpoint sure?
                self._source_commit_read(message.end_lsn, txn.xid, txn.commit_time_us)
            ktx = self.ktx
            if ktx.open:  # exactly-once: the source transaction is whole in the Kafka transaction
                ktx.events += txn.events
                ktx.last_end_lsn = message.end_lsn
                ktx.last_commit_us = txn.commit_time_us
                ktx.last_xid = txn.xid
                now = time.monotonic()
                if ktx.due(now, draining=self._draining(now)):
                    self._commit_kafka()
            if self._flood is not None:
                # The poison-flood brake: this transaction is whole, so the shutdown can confirm it (and
                # with exactly-once commit it) and a restart goes on after it.
                self._stop = True
                raise StopRequested
        elif isinstance(message, Relation):
            if self.router.relation(message):
                log.info(
                    "outbox table %s.%s has relation id %d", message.namespace, message.name, message.oid
                )
        elif isinstance(message, LogicalMessage):
            if message.prefix == HEARTBEAT_PREFIX:
                self.heartbeat.came_back()
            elif message.prefix == MESSAGE_PREFIX:
                if self._skipping and message.transactional:
                    return
                if not message.transactional or self._txn is None:
                    # No transaction to tie it to, so nothing to confirm it with: not an event. Counted,
                    # so that a producer that forgets `transactional => true` shows on /metrics.
                    self.ignored_messages += 1
                    log.warning(
                        "ignored a non-transactional 'outbox' message at %s (%d so far): only "
                        "transactional messages are events; emit it with pg_logical_emit_message(true, ...)",
                        format_lsn(message.lsn),
                        self.ignored_messages,
                    )
                    return
                try:
                    fields = self.router.message_fields(message.content)
                except MalformedEventError as exc:
                    self._dead_letter_raw(exc, self.router.salvage_message(message.content))
                    return
                id_, aggregate_type, aggregate_id, event_type, version, _, headers = fields
                if self.encoder.reads_exactly(event_type.decode(), int(version)):  # a decimal: its digits
                    payload = self.router.exact_payload(message.content)
                    fields = (id_, aggregate_type, aggregate_id, event_type, version, payload, headers)
                self._emit(fields)
        elif isinstance(message, Update | Delete | Truncate):
            log.debug("ignored %s on a published table: only inserts are events", type(message).__name__)
