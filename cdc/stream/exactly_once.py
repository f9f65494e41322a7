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
from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException

from cdc.errors import (
    DeliveryError,
    ProducerFencedError,
    SinkError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.stream.checkpoint import AckLatency, AckTracker
from cdc.stream.delivery import Delivery
from cdc.stream.identity import ServerIdentity, SkipBound, SlotIdentity
from cdc.stream.transactions import (
    FENCED,
    Checkpoint,
    classify,
    database_of,
    read_checkpoint,
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
            self.sink.become_transactional(transactional_id(s, server.system_id))
            self.sink.ensure_compacted_topic(s.checkpoint_topic)
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
        bound = self.checkpoint.holds(server) if self.checkpoint else SkipBound(0)
        if bound.note:
            log.warning("exactly-once: %s", bound.note)
        self._skip_below = bound.lsn
        self._skipping = False
        self._kafka_safe_lsn = self.tracker.confirmed_lsn

    def _begin_source_transaction(self, commit_lsn: int) -> None:
        """A Begin: skip the source transaction when a committed Kafka transaction holds it, else make sure
        a Kafka transaction is open for its events."""
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
            checkpoint = Checkpoint(ktx.last_end_lsn, ktx.last_commit_us, server.system_id, server.timeline)
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
