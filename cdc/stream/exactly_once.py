"""The exactly-once half of the pipeline's life (``delivery = "exactly-once"``): registering the
transactional id once the slot is ours, reading what the committed Kafka transactions cover and skipping it,
opening, committing and aborting the Kafka transactions around whole source transactions.

The records, the checkpoint and what they mean are :mod:`cdc.stream.transactions`; how far a checkpoint
holds on this server's WAL history is :mod:`cdc.stream.identity`. This mixin is the part of
:class:`cdc.stream.lifecycle.Lifecycle` that drives them.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException

from cdc.errors import (
    DeliveryError,
    HistoryDivergedError,
    ProducerFencedError,
    SinkError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.stream.checkpoint import AckLatency, AckTracker
from cdc.stream.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG, read_checkpoint
from cdc.stream.delivery import Delivery
from cdc.stream.identity import ServerIdentity, SkipBound, SlotIdentity
from cdc.stream.transactions import (
    FENCED,
    Checkpoint,
    classify,
    database_of,
    transactional_id,
)

log = logging.getLogger("cdc.pipeline")

COMMIT_WAIT = 1.0  # seconds one commit_transaction() call may block before the slot's connection is served


class ExactlyOnce(Delivery):
    """Kafka transactions around whole source transactions, with the checkpoint inside."""

    latency: AckLatency
    checkpoint: Checkpoint | None  # what the last committed Kafka transaction covers
    server: ServerIdentity | None  # whose WAL the current session reads
    slot_identity: SlotIdentity | None  # the checkpoint's key
    _checkpoint_stale: bool  # read it from Kafka before the next session streams
    _skip_below: int  # source transactions that commit below this LSN are in Kafka already
    _skipping: bool
    # The skip is provisional until the checkpoint's own transaction is read back from the slot (the slot
    # is held at _hold meanwhile); a checkpoint found not to be of this server's history is _foreign.
    _verify: Checkpoint | None
    _hold: int
    _foreign: Checkpoint | None
    kafka_commits: int
    kafka_aborts: int
    skipped_transactions: int

    def _start_transactions(self, server: ServerIdentity, slot: SlotIdentity, first: bool) -> None:
        """Once the slot is ours (so that a waiting standby fences no one): fence any earlier producer of
        the slot's transactional id, then read what the committed Kafka transactions cover. Every session
        skips the source transactions that the checkpoint holds on this server's WAL history."""
        s = self.settings
        if slot != self.slot_identity:
            if self.slot_identity is not None:
                log.warning(
                    "exactly-once: the slot is now %s (was %s): its checkpoint is read again",
                    slot.key.decode(),
                    self.slot_identity.key.decode(),
                )
            self.slot_identity = slot
            self._foreign = None
            self.sink.become_transactional(transactional_id(s, server.system_id))
            self.sink.ensure_compacted_topic(s.checkpoint_topic, CHECKPOINT_TOPIC_CONFIG)
            self._checkpoint_stale = True
        if self._checkpoint_stale:
            try:
                self.checkpoint = read_checkpoint(s, slot.key, s.startup_timeout)
            except SinkError as exc:
                if first:
                    raise
                raise TransactionAbortedError(f"the checkpoint could not be read back: {exc}") from exc
            self._checkpoint_stale = False
            log.info(
                "exactly-once: transactional id %s, checkpoint %s in %s under %s",
                self.sink.transactional_id,
                format_lsn(self.checkpoint.end_lsn) if self.checkpoint else "none yet",
                s.checkpoint_topic,
                slot.key.decode(),
            )
        checkpoint = self.checkpoint
        bound = checkpoint.holds(server) if checkpoint else SkipBound(0)
        if checkpoint is not None and checkpoint == self._foreign:
            bound = SkipBound(
                0,
                f"checkpoint {format_lsn(checkpoint.end_lsn)} is not of this server's history: nothing is "
                "skipped below it",
            )
        if bound.note:
            log.warning("exactly-once: %s", bound.note)
        self._skip_below = bound.lsn
        self._skipping = False
        self._kafka_safe_lsn = self._hold = self.tracker.confirmed_lsn
        # An LSN cannot tell two histories with one system identifier and timeline apart (a server restored
        # from a disk snapshot writes new transactions at the LSNs of the lost ones): the skip holds only
        # once the checkpoint's own transaction comes back from the slot. Until then nothing is confirmed
        # past the slot's position, and should the WAL pass the checkpoint without it, nothing is skipped.
        held = checkpoint is not None and bound.lsn == checkpoint.end_lsn > self._hold
        self._verify = checkpoint if held else None

    def _source_commit_read(self, end_lsn: int, xid: int, commit_time_us: int) -> None:
        """A source transaction ended at ``end_lsn``, while the skip is provisional: the checkpoint's own
        transaction makes it sure; any other one at or past the checkpoint shows another history."""
        verify = self._verify
        assert verify is not None
        if end_lsn < verify.end_lsn:
            return
        if not verify.is_transaction(end_lsn, xid, commit_time_us):
            self._diverged(f"transaction {xid} ends at {format_lsn(end_lsn)}")
        self._verify = None
        log.info(
            "exactly-once: the checkpoint's last transaction (%s, xid %s) is in this server's WAL: the %d "
            "source transactions skipped below it are in Kafka",
            format_lsn(end_lsn),
            xid,
            self.skipped_transactions,
        )

    def _passed_checkpoint(self, wal_end: int) -> None:
        """A keepalive while the skip is provisional and no source transaction is open: the server has sent
        everything up to ``wal_end``."""
        verify = self._verify
        if verify is not None and wal_end >= verify.end_lsn:
            self._diverged(f"the server sent its WAL up to {format_lsn(wal_end)}")

    def _diverged(self, what: str) -> NoReturn:
        verify = self._verify
        assert verify is not None
        self._verify = None
        self._foreign = verify
        raise HistoryDivergedError(
            f"checkpoint {format_lsn(verify.end_lsn)} (transaction {verify.xid} committed at "
            f"{_iso(verify.commit_time_us)}) is not of this server's history: {what} without it. The "
            "server was restored from a copy (a disk snapshot, a VM rollback) and wrote other transactions "
            "at those LSNs; the stream restarts from the slot and skips nothing below the checkpoint",
            lsn=self._hold,
        )

    def _begin_source_transaction(self, commit_lsn: int) -> None:
        """A Begin: skip the source transaction when a committed Kafka transaction holds it, else make sure
        a Kafka transaction is open for its events."""
        if self._verify is not None and commit_lsn >= self._verify.end_lsn:
            self._diverged(f"a transaction commits at {format_lsn(commit_lsn)}")
        self._skipping = commit_lsn < self._skip_below
        if self._skipping:
            self.skipped_transactions += 1
        elif not self.ktx.open:
            # Nothing is in the new transaction yet: all that is confirmable now stays so.
            self._kafka_safe_lsn = max(self._kafka_safe_lsn, self.tracker.confirmed_lsn)
            try:
                self.sink.begin_transaction()
            except KafkaException as exc:
                self._abort_kafka(self._classify(exc, "begin"))
            self.ktx.begun(time.monotonic())

    def _commit_kafka(self) -> None:
        """The checkpoint record, then the commit; retried while Kafka says it may be, keeping the slot's
        connection alive. What cannot commit is aborted (TransactionAbortedError: the stream restarts from
        the checkpoint); a fenced producer ends the run."""
        ktx, s = self.ktx, self.settings
        checkpoint = None
        if ktx.events:
            server, slot = self.server, self.slot_identity
            assert server is not None and slot is not None  # set before the first Kafka transaction began
            checkpoint = Checkpoint(
                ktx.last_end_lsn, ktx.last_commit_us, server.system_id, server.timeline, ktx.last_xid
            )
            value = checkpoint.encode(slot, database=database_of(s))
            self.sink.produce_checkpoint(s.checkpoint_topic, slot.key, value, self._keep_alive)
        deadline = time.monotonic() + s.delivery_timeout
        if self._stop:  # stopping: within shutdown_timeout
            deadline = min(deadline, time.monotonic() + self._shutdown_left())
        while True:
            try:
                self.sink.commit_transaction(COMMIT_WAIT)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retry = isinstance(err, KafkaError) and err.retriable() and not err.txn_requires_abort()
                if retry and time.monotonic() < deadline:
                    self._keep_alive()
                    continue
                self._abort_kafka(self._classify(exc, "commit"))
        ktx.open = False
        self.sink.poll(0)  # the delivery reports of what was committed: the watermark moves
        self.kafka_commits += 1
        if checkpoint is not None:
            self.checkpoint = checkpoint
        self._kafka_safe_lsn = max(self._kafka_safe_lsn, ktx.last_end_lsn)

    def _classify(self, exc: KafkaException, what: str) -> DeliveryError:
        ktx = self.ktx
        return classify(
            exc,
            what,
            self.sink.transactional_id or "",
            open_for=time.monotonic() - ktx.started if ktx.open else None,
            timeout_ms=self.sink.transaction_timeout_ms,
        )

    def _drop_kafka_transaction(self) -> None:
        """Forget the open Kafka transaction (aborted, or lost with its producer): its records are
        acknowledged but will never be read (read_committed), so the watermark goes back to what may be
        confirmed, what committed transactions cover."""
        confirmable = self._confirmable()
        if self.ktx.open:
            self.ktx.open = False
            self.kafka_aborts += 1
        self.tracker = AckTracker(confirmable, latency=self.latency)
        self._txn = None
        # An abort taken for failed may have committed (the coordinator finishes what a new producer's
        # init_transactions() finds): what Kafka holds decides what the next session skips.
        self._checkpoint_stale = True

    def _abort_kafka(self, reason: DeliveryError) -> NoReturn:
        """Abort the open Kafka transaction, then raise ``reason``."""
        self._drop_kafka_transaction()
        if isinstance(reason, ProducerFencedError):
            raise reason
        try:
            self.sink.abort_transaction(self.settings.delivery_timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in FENCED:
                raise self._classify(exc, "abort") from exc
            log.warning("could not abort the Kafka transaction (%s): a new producer replaces it", exc)
            self.sink.reset()
        raise reason

    def _shrink_batches_mid_transaction(self, topic: str, limit: int) -> NoReturn:
        """A topic takes smaller batches than the producer makes: a new producer is needed, and the open
        Kafka transaction cannot move to it. Abort it, then restart from the checkpoint."""
        if self.ktx.open:
            try:
                self.sink.abort_transaction(self.settings.delivery_timeout)
            except KafkaException as exc:
                log.debug("aborting before a new producer: %s", exc)
        self._drop_kafka_transaction()
        self.sink.shrink_batches(limit)
        raise TransactionAbortedError(f"topic {topic} takes smaller batches, so the producer was replaced")

    def _end_kafka_transaction(self) -> None:
        """Before the source goes (a lost connection, a replay, a stop): commit the open Kafka transaction
        when it holds whole source transactions only, else abort it."""
        if not self.ktx.open:
            return
        if self._txn is None and self.tracker.failure is None and self.sink.fatal_error is None:
            self._commit_kafka()
            return
        self._abort_kafka(TransactionAbortedError("a source transaction was cut short"))


def _iso(epoch_us: int) -> str:
    return datetime.fromtimestamp(epoch_us / 1e6, tz=UTC).isoformat()
