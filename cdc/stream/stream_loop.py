"""The hot loop: read from the slot, decode, hand each outbox row to the emitter; between reads, serve
Kafka's delivery reports, keep the slot confirmed and the idle slot moving.

One thread does everything that touches Python objects: it reads CopyData from the replication connection,
decodes, encodes, produces, and serves Kafka's delivery reports inside ``poll()``. librdkafka's own threads
do the network I/O to Kafka, and PostgreSQL's walsender decodes WAL in its own process, so the three stages
overlap without a lock on our side.

Owns the stream's reading position: the source transaction being read, how far the stream was read
(``received``) and what the server says its WAL end is. Everything else it tells the parts it was given: the
publisher where the source transactions begin and commit (and asks it whether to skip one), the
acknowledgement tracker, the confirmer, the stream's life. Per event it costs a bound method and an
attribute or two: no call more than the work needs.
"""

from __future__ import annotations

import logging
import time

from cdc.errors import CdcError, format_lsn
from cdc.stream.checkpoint import Acks, Transaction
from cdc.stream.confirm import Confirmer
from cdc.stream.deadletters import DeadLetters
from cdc.stream.emit import Emitter
from cdc.stream.failures import DeliveryFailures
from cdc.stream.heartbeat import PREFIX as HEARTBEAT_PREFIX
from cdc.stream.heartbeat import Heartbeat
from cdc.stream.life import Life
from cdc.stream.messages import Begin, Commit, Delete, Keepalive, LogicalMessage, Relation, Truncate, Update
from cdc.stream.pgoutput import decode, decode_copy_data, decode_insert_tuple
from cdc.stream.publisher import Publisher
from cdc.stream.route import MESSAGE_PREFIX, EventRouter
from cdc.stream.routes import Routes
from cdc.stream.sink import KafkaSink
from cdc.stream.slot_watch import SlotWatch
from cdc.stream.source import MAX_BATCH, ReplicationSource
from cdc.stream.waits import StopRequested

log = logging.getLogger("cdc.pipeline")

READ_TIMEOUT = 0.2  # seconds: how long one read waits for the database, which bounds the reaction to SIGTERM
# The stream has had more waiting at every read for this long: the pipeline drains a backlog (exactly-once
# then commits less often, cdc.stream.transactions.KafkaTransaction.due).
DRAINING_AFTER = 1.0


class StreamLoop:
    def __init__(
        self,
        *,
        life: Life,
        acks: Acks,
        router: EventRouter,
        routes: Routes,
        emitter: Emitter,
        publisher: Publisher,
        sink: KafkaSink,
        confirmer: Confirmer,
        failures: DeliveryFailures,
        dead_letters: DeadLetters,
        heartbeat: Heartbeat,
        slot_watch: SlotWatch,
    ) -> None:
        self._life = life
        self._acks = acks
        self._router = router
        self._routes = routes
        self._emitter = emitter
        self._publisher = publisher
        self._sink = sink
        self._confirmer = confirmer
        self._failures = failures
        self._dead_letters = dead_letters
        self._heartbeat = heartbeat
        self._slot_watch = slot_watch
        self._txn: Transaction | None = None  # the source transaction being read
        self.received = 0  # the highest WAL position read from the stream
        self.server_wal_end = 0  # the server's end of WAL, from keepalives and message envelopes
        self.ignored_messages = 0  # non-transactional 'outbox' logical messages: not events

    @property
    def in_transaction(self) -> bool:
        return self._txn is not None

    def reset(self, *, server_version: int) -> None:
        """A new session: no source transaction is open. Before PostgreSQL 14, pgoutput carries no logical
        message: the heartbeat is followed by keepalive."""
        self._txn = None
        self._emitter.end()
        self._heartbeat.by_keepalive = server_version < 140000

    def run(self, source: ReplicationSource) -> None:
        life, tracker, router, publisher = self._life, self._acks.tracker, self._router, self._publisher
        emit_row, emit_insert = self._emitter.row, self._emitter.insert
        poll, heartbeat, slot_watch = self._sink.poll, self._heartbeat, self._slot_watch
        confirmer, failures, routes = self._confirmer, self._failures, self._routes
        while not life.stopping:
            batch = source.read(READ_TIMEOUT)
            if len(batch) < MAX_BATCH:  # the read emptied what the server had sent: caught up
                life.caught_up(time.monotonic())
            last_wal = None
            for data in batch:
                if data[0] == 0x77:  # 'w' XLogData: 1 tag byte + 24 bytes of envelope, then pgoutput
                    last_wal = data
                    if data[25] == 0x49:  # 'I': the common case, decoded without the generic dispatch
                        read_row = router.row_reader
                        fields = None if read_row is None else read_row(data)
                        if fields is not None:
                            if not publisher.skipping:  # exactly-once: a source transaction Kafka holds
                                emit_row(fields)
                        else:  # the Python path: no compiled reader, or a row it left to this code
                            oid, values = decode_insert_tuple(data, offset=25)
                            if oid == router.outbox_oid and not publisher.skipping:
                                emit_insert(values)
                    else:
                        self._handle(decode(data[25:]))
                else:
                    keepalive = decode_copy_data(data)
                    if isinstance(keepalive, Keepalive):
                        if self._txn is None:
                            publisher.keepalive(keepalive.wal_end)
                        self.server_wal_end = keepalive.wal_end
                        tracker.keepalive(keepalive.wal_end)
                        if heartbeat.by_keepalive:
                            heartbeat.keepalive(keepalive.wal_end)
                        if keepalive.wal_end > self.received and tracker.idle:
                            self.received = keepalive.wal_end
                        if keepalive.reply_requested:
                            confirmer.send()
            now = time.monotonic()
            life.turned(now, tracker.acked_events)
            if last_wal is not None:
                self.received = max(self.received, int.from_bytes(last_wal[1:9], "big"))
                self.server_wal_end = int.from_bytes(last_wal[9:17], "big")
                life.carried(now)
            elif heartbeat.due(now, life.data_at):
                heartbeat.emit(now)
            if slot_watch.due(now):
                slot_watch.look(now)
            poll(0)
            if routes.reload_requested:
                routes.reload_now()
            if failures.pending():
                failures.fail()
            if self._txn is None:
                publisher.tick(now, now - life.caught_up_at > DRAINING_AFTER)
            confirmer.due(now)

    def _handle(self, message: object) -> None:
        if isinstance(message, Begin):
            txn = self._txn = self._acks.tracker.begin(message.xid, message.final_lsn, message.commit_time_us)
            lsn = format_lsn(message.final_lsn).encode()
            self._emitter.begin(txn, lsn, str(message.xid).encode(), message.commit_time_us // 1000)
            self._publisher.begin(message.final_lsn)
        elif isinstance(message, Commit):
            ended = self._txn
            if ended is None:
                raise CdcError("Commit without Begin on the replication stream", lsn=message.end_lsn)
            self._txn = None
            self._emitter.end()
            self._acks.tracker.commit(ended, message.end_lsn)
            now = time.monotonic()
            self._publisher.commit(
                ended, message.end_lsn, now, now - self._life.caught_up_at > DRAINING_AFTER
            )
            if self._dead_letters.flood is not None:
                # The poison-flood brake: this transaction is whole, so the shutdown can confirm it (and
                # with exactly-once commit it) and a restart goes on after it.
                self._life.request_stop()
                raise StopRequested
        elif isinstance(message, Relation):
            if self._router.relation(message):
                log.info(
                    "outbox table %s.%s has relation id %d", message.namespace, message.name, message.oid
                )
        elif isinstance(message, LogicalMessage):
            if message.prefix == HEARTBEAT_PREFIX:
                self._heartbeat.came_back()
            elif message.prefix == MESSAGE_PREFIX:
                if self._publisher.skipping and message.transactional:
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
                self._emitter.message(message)
        elif isinstance(message, Update | Delete | Truncate):
            log.debug("ignored %s on a published table: only inserts are events", type(message).__name__)
