"""The long-lived pipeline: source → decode → route + encode → sink, with ack-gated checkpoints.

One thread does everything that touches Python objects: it reads CopyData from the replication connection,
decodes, encodes, produces, and serves Kafka's delivery reports inside ``poll()``. librdkafka's own threads do
the network I/O to Kafka, and PostgreSQL's walsender decodes WAL in its own process, so the three stages
overlap without a lock on our side.

What may be confirmed to the slot is decided by :class:`cdc.checkpoint.AckTracker` alone; the pipeline sends
its watermark in standby status updates at least every ``status_interval`` and whenever it moves.

Failures: a lost PostgreSQL connection is retried with exponential backoff (the stream restarts from the
slot, so nothing is skipped); a failed Kafka delivery stops the pipeline without confirming past it; a bad
event goes to the dead-letter topic (or stops the pipeline when ``on_invalid_event = "stop"``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from cdc.checkpoint import AckLatency, AckTracker, Transaction
from cdc.config import Settings, describe_dsn
from cdc.decode import (
    Begin,
    Commit,
    Delete,
    Keepalive,
    LogicalMessage,
    Relation,
    Truncate,
    Update,
    Values,
    decode,
    decode_copy_data,
    decode_insert_tuple,
)
from cdc.encode import AvroEncoder, SchemaStore, confluent_header
from cdc.errors import (
    AggregateTypeNotAllowedError,
    CdcError,
    DeliveryError,
    DeliveryRefusedError,
    EventError,
    EventTooLargeError,
    InvalidTopicError,
    MalformedEventError,
    RegistryUnavailableError,
    SlotActiveError,
    SourceConnectionError,
    TopicMissingError,
    format_lsn,
)
from cdc.heartbeat import PREFIX as HEARTBEAT_PREFIX
from cdc.heartbeat import Heartbeat
from cdc.refusals import GAPLESS_STOP, RefusalLedger, error_code, record_digest, worst_case_size
from cdc.route import MESSAGE_PREFIX, EventRouter, OutboxEvent, RowFields, event_from_fields, parse_headers
from cdc.sink import DeliveryCallback, Headers, KafkaSink, ProducerStoppedError
from cdc.source import ReplicationSource, preflight

if TYPE_CHECKING:
    from cdc.registry import SchemaRegistry

log = logging.getLogger("cdc.pipeline")
# At DEBUG, one line per delivery report: where each event went (id, topic, partition, offset; no payload).
delivery_log = logging.getLogger("cdc.delivery")

READ_TIMEOUT = 0.2  # seconds: how long one read waits for the database, which bounds the reaction to SIGTERM
STATUS_MIN_INTERVAL = 0.1  # seconds between status updates that only report a moved watermark

# (topic, bound encoder, metric series, record limit): the series is the topic, or OTHER_TOPICS past
# MAX_TOPIC_SERIES; the limit is set when the topic takes less than the producer may send.
_Route = tuple[str, Callable[[bytes], bytes], str, int | None]
# The route cache and the metric series are keyed by values the rows bring: bounded, so that a stream of new
# aggregate types (a bug upstream, or an allow-list left off) cannot grow the process without end.
MAX_ROUTES = 10_000
MAX_TOPIC_SERIES = 1_000
OTHER_TOPICS = "(other topics)"
# A dead-letter record too large for Kafka is sent reduced: what is left of it always fits.
REDUCED_HEADER = "cdc_reduced"
REDUCED_NOTE = b"the record was too large: key cut to 256 bytes, value and row headers left out"
REDUCED_KEY_BYTES = 256
REDUCED_HEADER_BYTES = 1024
_T = TypeVar("_T")


class _StopRequested(Exception):
    """Internal: unwinds a wait (a full producer queue, a missing topic) when a stop was requested."""


class Backoff:
    """Exponential backoff: initial delay, multiplier, maximum."""

    def __init__(self, initial: float, multiplier: float, maximum: float) -> None:
        self.initial, self.multiplier, self.maximum = initial, multiplier, maximum
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.initial * self.multiplier**self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


class Pipeline:
    def __init__(self, settings: Settings, *, sink: KafkaSink | None = None) -> None:
        self.settings = settings
        self.router = EventRouter(settings)
        store = SchemaStore(settings.schemas_dir)
        self.encoder = AvroEncoder(store)
        self.registry: SchemaRegistry | None = None
        if settings.value_format == "confluent":
            # Imported only here: the registry client's HTTP stack costs start-up time and ~15 MB of RSS.
            from cdc.registry import SchemaRegistry

            self.registry = SchemaRegistry.from_settings(settings, store)
        self.sink = sink or KafkaSink(settings)
        self.latency = AckLatency()
        self.tracker = AckTracker(latency=self.latency)
        self._backoff = Backoff(settings.backoff_initial, settings.backoff_multiplier, settings.backoff_max)
        self._stop = False
        self._source: ReplicationSource | None = None
        self._received = 0  # the highest WAL position read from the stream
        self._sent_confirmed = -1
        self._txn: Transaction | None = None
        self._txn_lsn = b""
        self._txn_xid = b""
        self._txn_ts_ms = 0
        self.published_by_topic: defaultdict[str, int] = defaultdict(int)
        self.dead_lettered_by_reason: defaultdict[str, int] = defaultdict(int)
        self.delivery_errors = 0
        self.ignored_messages = 0  # non-transactional 'outbox' logical messages: not events
        self.reconnects = 0
        self.refusals = RefusalLedger()
        self.refusal_replays = 0  # times Kafka refused records and the stream was replayed to find why
        self._alone: bytes | None = None  # the digest of the record produced alone, while it is
        self.server_wal_end = 0  # the server's end of WAL, from keepalives and message envelopes
        self.heartbeat = Heartbeat(settings)
        self._last_data = time.monotonic()  # when the stream last carried a change
        self._routes: dict[tuple[bytes, bytes, bytes], _Route] = {}
        # Decided once: the hot path must not pay for a closure per event when nobody reads the lines.
        self._trace = delivery_log.isEnabledFor(logging.DEBUG)

    # -- control ---------------------------------------------------------------------------------------

    @property
    def events_published(self) -> int:
        return sum(self.published_by_topic.values())

    @property
    def events_dead_lettered(self) -> int:
        return sum(self.dead_lettered_by_reason.values())

    def not_ready(self) -> list[str]:
        """Why the pipeline is not ready (empty when it is): for /readyz."""
        reasons = []
        if self._source is None:
            reasons.append("not streaming from PostgreSQL")
        if not self.sink.broker_reachable():
            reasons.append("Kafka does not answer")
        return reasons

    def request_stop(self) -> None:
        """Ask the pipeline to stop reading and shut down gracefully (safe to call from a signal handler)."""
        self._stop = True

    def run(self) -> None:
        """Stream until a stop is requested; raise a CdcError when the pipeline cannot go on."""
        s = self.settings
        log.info(
            "starting: database %s, slot %s, publication %s, table %s, kafka %s",
            describe_dsn(s.database_url),
            s.slot,
            s.publication,
            s.table,
            s.kafka.bootstrap_servers,
        )
        self.sink.check_broker(s.startup_timeout)
        backoff = self._backoff
        first = True
        try:
            while not self._stop:
                try:
                    self._session(first)
                    break
                except _StopRequested:
                    break
                except DeliveryRefusedError as exc:
                    self._replay_after_refusal(exc)
                except (SourceConnectionError, SlotActiveError) as exc:
                    # A slot still held by our own dead walsender is transient after a lost connection;
                    # at the first start it means another pipeline, which is a refusal.
                    if first and (isinstance(exc, SlotActiveError) or self._source is None):
                        raise
                    self._close_source()
                    self.reconnects += 1
                    self._drain_after_loss()
                    delay = backoff.next_delay()
                    log.warning(
                        "PostgreSQL: %s; reconnecting in %.1f s (attempt %d)", exc, delay, backoff.attempt
                    )
                    self._sleep(delay)
                first = False
        finally:
            self._shutdown()

    def _session(self, first: bool) -> None:
        if self.tracker.failure is not None or self.sink.fatal_error is not None:
            self._delivery_failed()  # seen while reconnecting: must not be forgotten with the old tracker
        s = self.settings
        info = preflight(
            s.database_url, slot=s.slot, publication=s.publication, table=(s.table.schema, s.table.name)
        )
        self.tracker = AckTracker(
            max(info.confirmed_flush_lsn, self.tracker.confirmed_lsn), latency=self.latency
        )
        self._sent_confirmed = -1
        self._txn = None
        source = ReplicationSource(s.database_url, slot=s.slot, publication=s.publication)
        source.start()
        self._source = source
        self._backoff.reset()
        log.info(
            "slot %s: resuming after confirmed LSN %s%s",
            s.slot,
            format_lsn(info.confirmed_flush_lsn),
            "" if first else " (reconnected)",
        )
        self._stream(source)

    # -- the hot loop ----------------------------------------------------------------------------------

    def _stream(self, source: ReplicationSource) -> None:
        tracker = self.tracker
        router = self.router
        outbox_insert = self._outbox_insert
        poll = self.sink.poll
        status_interval = self.settings.status_interval
        heartbeat = self.heartbeat
        while not self._stop:
            batch = source.read(READ_TIMEOUT)
            last_wal = None
            for data in batch:
                if data[0] == 0x77:  # 'w' XLogData: 1 tag byte + 24 bytes of envelope, then pgoutput
                    last_wal = data
                    if data[25] == 0x49:  # 'I': the common case, decoded without the generic dispatch
                        oid, values = decode_insert_tuple(data, offset=25)
                        if oid == router.outbox_oid:
                            outbox_insert(values)
                    else:
                        self._handle(decode(data[25:]))
                else:
                    keepalive = decode_copy_data(data)
                    if isinstance(keepalive, Keepalive):
                        self.server_wal_end = keepalive.wal_end
                        tracker.keepalive(keepalive.wal_end)
                        if keepalive.wal_end > self._received and tracker.idle:
                            self._received = keepalive.wal_end
                        if keepalive.reply_requested:
                            self._send_status()
            now = time.monotonic()
            if last_wal is not None:
                self._received = max(self._received, int.from_bytes(last_wal[1:9], "big"))
                self.server_wal_end = int.from_bytes(last_wal[9:17], "big")
                self._last_data = now
            elif heartbeat.due(now, self._last_data):
                heartbeat.emit(now)
            poll(0)
            if tracker.failure is not None or self.sink.fatal_error is not None:
                self._delivery_failed()
            # Status updates: whenever the watermark moved, but not more often than STATUS_MIN_INTERVAL
            # (at tens of thousands of events a second it moves with every batch), and at least every
            # status_interval so the server does not take us for dead.
            since = now - source.last_status_at
            if since >= status_interval or (
                tracker.confirmed_lsn != self._sent_confirmed and since >= STATUS_MIN_INTERVAL
            ):
                self._send_status()

    def _outbox_insert(self, values: Values) -> None:
        try:
            fields = self.router.row_fields(values)
        except MalformedEventError as exc:
            self._dead_letter_raw(exc, self.router.salvage(values))
            return
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

    def _route_for(self, aggregate_type: bytes, event_type: bytes, version: bytes) -> _Route:
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
        encode = self.encoder.encoder_for(et, v)  # the schema file first: a missing one is the event's fault
        if self.registry is not None:
            encode = self.encoder.encoder_for(et, v, header=confluent_header(self._schema_id(topic, et, v)))
        self._ensure_topic(topic)
        limit = self.sink.record_limit(topic)
        if limit is not None and not self.sink.batches_fit(limit):
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
        elif isinstance(message, Commit):
            txn = self._txn
            if txn is None:
                raise CdcError("Commit without Begin on the replication stream", lsn=message.end_lsn)
            self._txn = None
            self.tracker.commit(txn, message.end_lsn)
        elif isinstance(message, Relation):
            if self.router.relation(message):
                log.info(
                    "outbox table %s.%s has relation id %d", message.namespace, message.name, message.oid
                )
        elif isinstance(message, LogicalMessage):
            if message.prefix == HEARTBEAT_PREFIX:
                self.heartbeat.came_back()
            elif message.prefix == MESSAGE_PREFIX:
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
                self._emit(fields)
        elif isinstance(message, Update | Delete | Truncate):
            log.debug("ignored %s on a published table: only inserts are events", type(message).__name__)

    # -- bad events ------------------------------------------------------------------------------------

    def _dead_letter(self, event: OutboxEvent, exc: EventError, original_topic: str) -> None:
        if self.settings.on_invalid_event == "stop":
            raise exc
        log.warning(
            "event %s (%s v%d) goes to the dead-letter topic %s: %s",
            event.id,
            event.event_type,
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
            event_id or "without an id",
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
            ("id", event_id.encode()),
        ]

    def _send_dead_letter(
        self, reason: str, key: bytes | None, value: bytes | None, headers: Headers, row_headers: Headers
    ) -> None:
        """The dead-letter record: ``headers`` (ours: reason, id, types), then the event's own. When even
        that is too large (a huge key or row headers), a reduced record goes instead, one that always fits:
        the key cut short, no value, no row headers, every header value cut short, and a note of what is
        missing. Counted once handed over."""
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
            self._send(topic, key, value, full, on_delivery)
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
            self._send(topic, short_key, None, reduced, on_delivery)
        txn.sent()
        self.dead_lettered_by_reason[reason] += 1

    # -- records Kafka refuses --------------------------------------------------------------------------

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: DeliveryCallback,
    ) -> None:
        """Produce one record; alone (the queue empty before and after) when Kafka refused it before, so
        that what Kafka says is about this record only."""
        refusals = self.refusals
        digest = record_digest(topic, key, value) if refusals.active else None
        try:
            if digest is not None and refusals.must_go_alone(digest):
                self._wait_empty()
                self._alone = digest
                self.sink.produce(topic, key, value, headers, self._txn_ts_ms, on_delivery, self._keep_alive)
                self._wait_empty()
                self._alone = None
                refusals.cleared(digest)
                return
            self.sink.produce(topic, key, value, headers, self._txn_ts_ms, on_delivery, self._keep_alive)
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

    def _delivery_failed(self) -> NoReturn:
        """Kafka failed a delivery, or the producer stopped: nothing more is produced. A refusal of records
        (too large, invalid) is the events' fault: DeliveryRefusedError, which run() answers with a replay.
        Any other failure ends the run without confirming past it."""
        sink, tracker = self.sink, self.tracker
        if sink.fatal_error is None:
            sink.purge_queue()  # its poll may be the one that learns the producer stopped
        if sink.fatal_error is not None:
            # A stopped producer fails what it held at once: read those reports, to know every refusal.
            deadline = time.monotonic() + 5.0
            while sink.queue_depth() and time.monotonic() < deadline:
                sink.poll(0.1)
        self.delivery_errors += 1
        failure = tracker.failure
        lsn = failure.commit_lsn if failure is not None else tracker.confirmed_lsn
        fatal = sink.fatal_error
        if tracker.refused or error_code(fatal) == GAPLESS_STOP:
            # Without reports (confluent-kafka can lose them to the fatal error) the replay still reads
            # the topics' limits again; the ledger stops a replay that makes no progress.
            first = tracker.refused[0][1] if tracker.refused else fatal
            raise DeliveryRefusedError(
                f"Kafka refused {len(tracker.refused)} records: {_kafka_error_text(first)}",
                refused=list(tracker.refused),
                lsn=lsn,
            )
        if failure is not None:
            raise DeliveryError(
                f"Kafka refused an event of transaction {failure.xid}: "
                f"{_kafka_error_text(failure.error)}; stopping without confirming past it "
                "(a restart resumes from the slot)",
                lsn=lsn,
            )
        raise DeliveryError(f"the Kafka producer failed fatally: {_kafka_error_text(fatal)}", lsn=lsn)

    def _replay_after_refusal(self, exc: DeliveryRefusedError) -> None:
        """Kafka refused records and the producer stopped before anything went behind them: replay from
        the slot with a new producer; the refused records are produced alone, and the one Kafka refuses
        alone is dead-lettered (cdc.refusals)."""
        self.refusals.note(
            exc.refused, alone=self._alone, at=self.tracker.confirmed_lsn, until=self._received
        )
        self._alone = None
        self._close_source()
        self.sink.reset()
        self.tracker = AckTracker(self.tracker.confirmed_lsn, latency=self.latency)
        self._routes.clear()  # topic limits are read again
        self.refusal_replays += 1
        log.warning(
            "%s; replaying from the slot and producing the refused records one at a time (replay %d)",
            exc,
            self.refusal_replays,
        )

    def _wait_empty(self) -> None:
        """Until every record handed to the producer is acknowledged (or one failed)."""
        sink = self.sink
        while sink.queue_depth():
            sink.poll(0.05)
            self._keep_alive()
        if self.tracker.failure is not None or sink.fatal_error is not None:
            self._delivery_failed()

    # -- waiting and status ----------------------------------------------------------------------------

    def _ensure_topic(self, topic: str) -> None:
        self._waiting(lambda: self.sink.ensure_topic(topic), TopicMissingError, f"topic {topic} exists now")

    def _waiting(self, attempt: Callable[[], _T], waits_on: type[CdcError], recovered: str) -> _T:
        """``attempt()``, again and again with backoff while it raises ``waits_on`` (an infrastructure
        problem the event is not to blame for), keeping the replication connection alive meanwhile."""
        try:
            return attempt()
        except waits_on as exc:
            log.warning("%s; waiting, with backoff", exc)
        s = self.settings
        backoff = Backoff(s.backoff_initial, s.backoff_multiplier, s.backoff_max)
        while True:
            self._sleep(backoff.next_delay(), keep_alive=True)
            if self._stop:
                raise _StopRequested
            try:
                result = attempt()
            except waits_on as exc:
                log.warning("%s (attempt %d); waiting, with backoff", exc, backoff.attempt)
                continue
            log.info("%s; going on", recovered)
            return result

    def _keep_alive(self) -> None:
        """Called while waiting on Kafka (a full producer queue, a missing topic, the registry): keep the
        status updates flowing, and confirm a moved watermark as often as the stream loop does. A full
        queue is where acknowledgements arrive fastest; left unconfirmed, a kill -9 would publish them
        again, beyond the in-flight window. A failed delivery ends the wait: nothing is produced after it."""
        if self._stop:
            raise _StopRequested
        if self.tracker.failure is not None or self.sink.fatal_error is not None:
            self._delivery_failed()
        source = self._source
        if source is None:
            return
        since = time.monotonic() - source.last_status_at
        if since >= min(1.0, self.settings.status_interval) or (
            self.tracker.confirmed_lsn != self._sent_confirmed and since >= STATUS_MIN_INTERVAL
        ):
            self._send_status()

    def _send_status(self) -> None:
        source = self._source
        if source is None:
            return
        confirmed = self.tracker.confirmed_lsn
        source.send_status(max(self._received, confirmed), confirmed)
        if self.refusals.active:
            self.refusals.settled(confirmed)
        if confirmed != self._sent_confirmed:
            log.debug("confirmed %s", format_lsn(confirmed))
        self._sent_confirmed = confirmed

    def _sleep(self, seconds: float, keep_alive: bool = False) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and (left := deadline - time.monotonic()) > 0:
            self.sink.poll(min(left, 0.2))
            if keep_alive:
                self._keep_alive()

    # -- endings ---------------------------------------------------------------------------------------

    def _drain_after_loss(self) -> None:
        """After losing the source: let Kafka finish what it has, so the restarted stream's replays come
        after, not interleaved with, the first copies (per-aggregate order across reconnects)."""
        left = self.sink.flush(self.settings.shutdown_timeout)
        if left:
            raise DeliveryError(
                f"{left} events still unacknowledged {self.settings.shutdown_timeout:g} s after "
                "losing PostgreSQL; stopping",
                lsn=self.tracker.confirmed_lsn,
            )

    def _close_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            source.close()

    def _shutdown(self) -> None:
        """Stop reading, wait (bounded) for what is in flight, confirm what was acknowledged, close."""
        timeout = self.settings.shutdown_timeout
        if self.tracker.failure is not None:
            self.sink.purge_queue()  # what it still holds would land behind the failed record
        left = self.sink.flush(timeout)
        if left:
            log.warning(
                "%d events not acknowledged within shutdown_timeout (%g s); they will be published "
                "again after a restart",
                left,
                timeout,
            )
        self.heartbeat.close()
        if self.registry is not None:
            self.registry.close()
        source = self._source
        if source is not None:
            try:
                self._send_status()
            except SourceConnectionError as exc:
                log.warning(
                    "could not confirm %s at shutdown (%s): events after the slot's position will be "
                    "published again",
                    format_lsn(self.tracker.confirmed_lsn),
                    exc,
                )
            self._source = None
            source.finish()
        log.info(
            "stopped: %d events published, %d dead-lettered, confirmed LSN %s",
            self.events_published,
            self.events_dead_lettered,
            format_lsn(self.tracker.confirmed_lsn),
        )
        latency = self.latency
        if latency.total:
            log.info(
                "commit-to-ack over %d events: p50 %s ms, p99 %s ms, max %d ms",
                latency.total,
                latency.percentile(0.5),
                latency.percentile(0.99),
                latency.max_ms,
            )


def _traced(delivered: DeliveryCallback, event_id: str | bytes | None) -> DeliveryCallback:
    """``delivered``, with a DEBUG line per report first: grep an event id in the log to see where it went.
    (A delivery report carries no headers, so the id comes with the closure.)"""
    text = event_id.decode(errors="replace") if isinstance(event_id, bytes) else str(event_id or "")

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivery_log.debug(
                "event %s acknowledged: %s [%d] @ %s", text, msg.topic(), msg.partition(), msg.offset()
            )
        else:
            delivery_log.debug("event %s not delivered to %s: %s", text, msg.topic(), _kafka_error_text(err))
        delivered(err, msg)

    return on_delivery


def _kafka_error_text(error: object) -> str:
    text: Callable[[], str] | None = getattr(error, "str", None)
    return text() if callable(text) else str(error)
