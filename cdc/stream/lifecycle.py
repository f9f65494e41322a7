"""The pipeline's life: start, stream, reconnect with backoff, replay after a refusal, shut down.

A lost PostgreSQL connection is retried with exponential backoff (:mod:`cdc.stream.reconnect`). Records
Kafka refused make it replay from the slot with a new producer (:mod:`cdc.stream.refusals`). Any other
failed delivery ends the run without confirming past it. SIGTERM stops reading, waits (bounded) for what is
in flight, confirms what was acknowledged and closes. Exactly-once delivery is :mod:`cdc.stream.exactly_once`;
what the probes ask, :mod:`cdc.stream.health`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING

from cdc import fastpath
from cdc.avro.reload import SchemaSet
from cdc.config import Settings, describe_dsn
from cdc.errors import (
    CdcError,
    DeliveryError,
    DeliveryRefusedError,
    SlotActiveError,
    SourceConnectionError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.pg import access_refusal, database_dsn
from cdc.stream.access import topic_rights
from cdc.stream.checkpoint import AckLatency, AckTracker, Transaction
from cdc.stream.delivery import delivery_log
from cdc.stream.health import Health
from cdc.stream.heartbeat import Heartbeat
from cdc.stream.identity import ServerIdentity, SlotIdentity
from cdc.stream.preflight import preflight
from cdc.stream.progress import PositionWriter, checkpoint_table, settle_partitioner
from cdc.stream.reconnect import Reconnects
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import EventRouter, Route
from cdc.stream.sink import Headers, KafkaSink
from cdc.stream.slot_watch import SlotWatch
from cdc.stream.source import ReplicationSource
from cdc.stream.transactions import (
    Checkpoint,
    KafkaTransaction,
)
from cdc.stream.waits import SHUTDOWN_RESERVE, Backoff, StopRequested

if TYPE_CHECKING:
    from cdc.avro.registry import SchemaRegistry

log = logging.getLogger("cdc.pipeline")

STANDBY_POLL = 1.0  # seconds between a standby's attempts to take the slot over


class Lifecycle(Reconnects, Health):
    """Everything about the pipeline but the stream loop itself (:class:`cdc.stream.pipeline.Pipeline`)."""

    def __init__(
        self, settings: Settings, *, sink: KafkaSink | None = None, accept_partitioner_change: bool = False
    ) -> None:
        self.settings = settings
        self._accept_partitioner_change = accept_partitioner_change
        compiled = fastpath.enabled(settings.fast_path)
        self.router = EventRouter(settings, compiled=compiled)
        # Checked as `cdc schemas check` does (a ConfigError when it fails), re-read on a miss or SIGHUP.
        self.schemas = SchemaSet(settings.schemas_dir, settings.schema_compatibility, compiled=compiled)
        self.encoder = self.schemas.encoder
        self._reload_requested = False
        self.registry: SchemaRegistry | None = None
        if settings.value_format == "confluent":
            # Imported only here: the registry client's HTTP stack costs start-up time and ~15 MB of RSS.
            from cdc.avro.registry import SchemaRegistry

            self.registry = SchemaRegistry.from_settings(settings, self.schemas.store)
        self.sink = sink or KafkaSink(settings)
        self.latency = AckLatency()
        self.tracker = AckTracker(latency=self.latency)
        self._backoff = Backoff(settings.backoff_initial, settings.backoff_multiplier, settings.backoff_max)
        self._stop = False
        self._stop_at: float | None = None  # monotonic time of the stop request
        self._last_walsender: int | None = None  # the walsender pid of the last closed source
        self._source: ReplicationSource | None = None
        self._received = 0  # the highest WAL position read from the stream
        self._sent_confirmed = -1
        self._txn: Transaction | None = None
        self._txn_lsn = b""
        self._txn_xid = b""
        self._txn_ts_ms = 0
        self.published_by_topic: defaultdict[str, int] = defaultdict(int)
        self.dead_lettered_by_reason: defaultdict[str, int] = defaultdict(int)
        limit = settings.max_dead_letters
        self._dead_letter_times: deque[float] | None = deque(maxlen=limit) if limit else None
        self._flood = None
        self.delivery_errors = 0
        self.ignored_messages = 0  # non-transactional 'outbox' logical messages: not events
        self.reconnects = 0
        self.standing_by = False  # a standby waiting for the slot (on_slot_active = wait): cdc_standby
        self.refusals = RefusalLedger()
        self.refusal_replays = 0  # times Kafka refused records and the stream was replayed to find why
        self._alone: bytes | None = None  # the digest of the record produced alone, while it is
        self.server_wal_end = 0  # the server's end of WAL, from keepalives and message envelopes
        self.heartbeat = Heartbeat(settings)
        self.slot_watch = SlotWatch(settings)  # other slots created or dropped on the cluster
        self.position = PositionWriter(settings)  # for `cdc recover`: how far Kafka acknowledged the outbox
        self._last_data = time.monotonic()  # when the stream last carried a change
        self._caught_up = time.monotonic()  # when a read last emptied what the server had sent
        self.turned_at = self.last_ack_at = time.monotonic()
        self._acked_seen = 0
        self._routes: dict[tuple[bytes, bytes, bytes], Route] = {}
        # Exactly-once delivery (cdc.stream.transactions).
        self.exactly_once = settings.delivery == "exactly-once"
        self.ktx = KafkaTransaction(settings)
        self.checkpoint: Checkpoint | None = None  # what the last committed Kafka transaction covers
        self.server: ServerIdentity | None = None  # whose WAL the current session reads
        self.slot_identity: SlotIdentity | None = None  # the checkpoint's key
        self._checkpoint_stale = True  # read it from Kafka before the next session streams
        self._kafka_safe_lsn = 0
        self._skip_below = 0  # source transactions that commit below this LSN are in Kafka already
        self._skipping = False
        self.kafka_commits = 0
        self.kafka_aborts = 0
        self.skipped_transactions = 0
        # Decided once: the hot path must not pay for a closure per event when nobody reads the lines.
        self._trace = delivery_log.isEnabledFor(logging.DEBUG)
        # Headers every record gets after the pipeline's own: `cdc outbox republish` marks its copies.
        self._extra_headers: Headers = []

    @property
    def events_published(self) -> int:
        return sum(self.published_by_topic.values())

    @property
    def events_dead_lettered(self) -> int:
        return sum(self.dead_lettered_by_reason.values())

    def request_schema_reload(self) -> None:
        """Ask the pipeline to re-read schemas_dir between two reads of the stream (safe to call from a
        signal handler: SIGHUP)."""
        self._reload_requested = True

    def _reload_schemas(self, missing: tuple[str, int] | None = None) -> bool:
        """Re-read schemas_dir: throttled for a ``missing`` (event type, version), else at once (SIGHUP);
        True when new schemas are in use. Cached routes stay valid: a re-read that changes a loaded version
        is refused."""
        schemas = self.schemas
        changed = schemas.reload_on_miss(*missing) if missing is not None else schemas.reload("SIGHUP")
        if changed:
            self.encoder = schemas.encoder
            if self.registry is not None:
                self.registry.store = schemas.store
        return changed

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
        try:
            self.sink.check_broker(s.startup_timeout)
            self.sink.ensure_dead_letter_topic(s.dlq_topic)
            self.sink.check_rights(topic_rights(s), s.startup_timeout)
            if self.registry is not None:
                self.registry.check_access()
        except CdcError:
            # Now, while Python runs: a librdkafka thread still calling back (a broker that keeps refusing
            # the credentials) crashed the interpreter's own shutdown.
            self.sink.close()
            raise
        backoff = self._backoff
        started = time.monotonic()
        first = True
        try:
            while not self._stop:
                try:
                    self._session(first)
                    break
                except StopRequested:
                    break
                except DeliveryRefusedError as exc:
                    self._replay_after_refusal(exc)
                except TransactionAbortedError as exc:
                    self._restart_from_checkpoint(exc, backoff)
                except SlotActiveError as exc:
                    if first and s.on_slot_active == "wait":
                        # A standby: the slot admits one walsender, so waiting on it is the whole protocol.
                        if not self.standing_by:
                            log.warning("%s; waiting to take over (on_slot_active = wait)", exc)
                            self.standing_by = True
                        self._sleep(STANDBY_POLL)
                        continue
                    if first:
                        raise  # another pipeline streams from the slot: a refusal
                    if not self._end_own_walsender(exc):
                        self._reconnect_later(exc, backoff)
                except SourceConnectionError as exc:
                    # A slot still held by our own dead walsender is transient after a lost connection.
                    # At the first start, a database that is restarting or being promoted ("not yet
                    # accepting connections") is waited for as Kafka is, up to startup_timeout; one that
                    # still does not answer then is a refusal, and a supervisor's restart makes it seen.
                    if first and self._source is None:
                        denied = access_refusal(exc)
                        if denied is not None:
                            raise denied from exc  # waiting would not change the setting
                        if time.monotonic() - started >= s.startup_timeout:
                            raise
                        delay = backoff.next_delay()
                        log.warning(
                            "PostgreSQL: %s; the start waits for it (attempt %d, next in %.1f s, up to "
                            "startup_timeout = %g s)",
                            exc,
                            backoff.attempt,
                            delay,
                            s.startup_timeout,
                        )
                        self._sleep(delay)
                        continue
                    self._reconnect_later(exc, backoff)
                first = False
        finally:
            self._shutdown()
        flood = self._flood
        if flood is not None:  # stopped in order, as at SIGTERM: now the exit code and the line say why
            flood.lsn = self._confirmable()
            raise flood

    def _session(self, first: bool) -> None:
        if self.tracker.failure is not None or self.sink.fatal_error is not None:
            self._delivery_failed()  # seen while reconnecting: must not be forgotten with the old tracker
        s = self.settings
        info = preflight(
            database_dsn(s),
            slot=s.slot,
            publication=s.publication,
            table=(s.table.schema, s.table.name),
            check_failover=first,
            checkpoint_table=checkpoint_table(s),
            timeout=s.query_timeout,
            silence=s.source_silence_timeout,
        )
        if first:
            settle_partitioner(s, accept_change=self._accept_partitioner_change)
        self._sent_confirmed = -1
        self._txn = None
        if first and info.server_version < 140000:
            log.warning(
                "PostgreSQL %d: pgoutput cannot carry logical messages before 14, so events emitted with "
                "pg_logical_emit_message are not read; write them as outbox rows (outbox_emit). "
                "Heartbeats are followed by keepalive",
                info.server_version // 10000,
            )
        self.heartbeat.by_keepalive = info.server_version < 140000
        source = ReplicationSource(
            database_dsn(s), slot=s.slot, publication=s.publication, silence=s.source_silence_timeout
        )
        source.start()
        self._source = source
        self.standing_by = False
        server = source.identity
        assert server is not None  # start() asked
        # What was acknowledged on another history (another server, a timeline left by a promotion) means
        # nothing here: only the slot's own position counts then.
        known = self.server is not None and (server.system_id, server.timeline) == (
            self.server.system_id,
            self.server.timeline,
        )
        acked = self.tracker.confirmed_lsn if known else 0
        self.tracker = AckTracker(max(info.confirmed_flush_lsn, acked), latency=self.latency)
        self.server = server
        if self.exactly_once:
            self._start_transactions(server, SlotIdentity(server.system_id, s.slot, info.created_lsn), first)
        self._backoff.reset()
        log.info(
            "slot %s: resuming after confirmed LSN %s%s",
            s.slot,
            format_lsn(info.confirmed_flush_lsn),
            "" if first else " (reconnected)",
        )
        self._stream(source)

    def _stream(self, source: ReplicationSource) -> None:
        raise NotImplementedError  # the hot loop: cdc.stream.pipeline.Pipeline

    def _replay_after_refusal(self, exc: DeliveryRefusedError) -> None:
        """Kafka refused records and the producer stopped before anything went behind them: replay from
        the slot with a new producer; the refused records are produced alone, and the one Kafka refuses
        alone is dead-lettered (cdc.stream.refusals)."""
        self.refusals.note(
            exc.refused, alone=self._alone, at=self.tracker.confirmed_lsn, until=self._received
        )
        self._alone = None
        self._close_source()
        self._drop_kafka_transaction()  # exactly-once: its records are refused or behind a refusal
        self.sink.reset()
        self._routes.clear()  # topic limits are read again
        self.refusal_replays += 1
        log.warning(
            "%s; replaying from the slot and producing the refused records one at a time (replay %d)",
            exc,
            self.refusal_replays,
        )

    def _shutdown(self) -> None:
        """Stop reading, wait (bounded) for what is in flight, confirm what was acknowledged, close."""
        timeout = self.settings.shutdown_timeout
        if self.ktx.open:
            try:
                self._end_kafka_transaction()
            except (DeliveryError, StopRequested) as exc:
                log.warning("the open Kafka transaction was not committed: %s", exc)
        if self.tracker.failure is not None:
            self.sink.purge_queue()  # what it still holds would land behind the failed record
        left = self.sink.flush(self._shutdown_left())
        if left:
            log.warning(
                "%d events not acknowledged within shutdown_timeout (%g s); they will be published "
                "again after a restart",
                left,
                timeout,
            )
        self.heartbeat.close()
        self.slot_watch.close()
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
                    format_lsn(self._confirmable()),
                    exc,
                )
            self._source = None
            source.finish(timeout=min(2.0, SHUTDOWN_RESERVE / 2))
        self.position.offer(float("inf"), self._sent_confirmed, self.tracker.last_outbox)
        self.position.close()
        log.info(
            "stopped: %d events published, %d dead-lettered, confirmed LSN %s",
            self.events_published,
            self.events_dead_lettered,
            format_lsn(self._confirmable()),
        )
        if self.exactly_once:
            log.info(
                "exactly-once: %d Kafka transactions committed, %d aborted, %d source transactions skipped",
                self.kafka_commits,
                self.kafka_aborts,
                self.skipped_transactions,
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
