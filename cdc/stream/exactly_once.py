"""The exactly-once publisher (``delivery = "exactly-once"``): Kafka transactions around whole source
transactions, with the checkpoint inside.

Owns the open Kafka transaction, the checkpoint it last committed (and whether it must be read back from
Kafka), the WAL history the session reads (:mod:`cdc.stream.identity`), the skip point below which source
transactions are in Kafka already, and the check that makes a skip sure. The records, the checkpoint and what
they mean are :mod:`cdc.stream.transactions`; reading the checkpoint back, :mod:`cdc.stream.checkpoint_topic`.

Gets from the pipeline: the settings, the sink, the acknowledgements (:class:`cdc.stream.checkpoint.Acks`:
an aborted transaction's records are acknowledged but never read, so the watermark goes back), and callables:
``keep_alive`` (while a commit is retried), ``pending_failure`` (a failed delivery: abort, never commit) and
``shutdown_left`` (seconds a stopping pipeline may still wait, or None while it is not stopping).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException

from cdc.config import Settings
from cdc.errors import (
    DeliveryError,
    HistoryDivergedError,
    ProducerFencedError,
    SinkError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.stream.checkpoint import Acks, Transaction
from cdc.stream.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG, read_checkpoint
from cdc.stream.identity import ServerIdentity, SkipBound, SlotIdentity
from cdc.stream.sink import KafkaSink
from cdc.stream.transactions import (
    FENCED,
    Checkpoint,
    KafkaTransaction,
    classify,
    database_of,
    transactional_id,
)
from cdc.stream.waits import StopRequested

log = logging.getLogger("cdc.pipeline")

COMMIT_WAIT = 1.0  # seconds one commit_transaction() call may block before the slot's connection is served


class ExactlyOnce:
    """A :class:`cdc.stream.publisher.Publisher` with Kafka transactions and a checkpoint."""

    def __init__(
        self,
        settings: Settings,
        sink: KafkaSink,
        acks: Acks,
        *,
        keep_alive: Callable[[], None],
        pending_failure: Callable[[], bool],
        shutdown_left: Callable[[], float | None],
        end_spans: Callable[[list[Any], bool], None] = lambda spans, committed: None,
    ) -> None:
        self._settings = settings
        self._sink = sink
        self._acks = acks
        self._keep_alive = keep_alive
        self._pending_failure = pending_failure
        self._shutdown_left = shutdown_left
        self._end_spans = end_spans  # the traced records' spans end with their Kafka transaction
        self._spans: list[Any] = []
        self._ktx = KafkaTransaction(settings)
        self.checkpoint: Checkpoint | None = None  # what the last committed Kafka transaction covers
        self._server: ServerIdentity | None = None  # whose WAL the current session reads
        self._slot: SlotIdentity | None = None  # the checkpoint's key
        self._stale = True  # read the checkpoint from Kafka before the next session streams
        self._skip_below = 0  # source transactions that commit below this LSN are in Kafka already
        self.skipping = False
        # The skip is provisional until the checkpoint's own transaction is read back from the slot (the
        # slot is held at _hold meanwhile); a checkpoint found not to be of this server's history is foreign.
        self._verify: Checkpoint | None = None
        self._hold = 0
        self._foreign: Checkpoint | None = None
        self._safe_lsn = 0  # what committed Kafka transactions cover: the slot's bound while one is open
        self.commits = self.aborts = self.skipped = 0

    # -- a session -------------------------------------------------------------------------------------------

    def start(self, server: ServerIdentity, slot: SlotIdentity, *, first: bool, confirmed: int) -> None:
        """Once the slot is ours (so that a waiting standby fences no one): fence any earlier producer of
        the slot's transactional id, then read what the committed Kafka transactions cover. Every session
        skips the source transactions that the checkpoint holds on this server's WAL history."""
        s = self._settings
        self._server = server
        if slot != self._slot:
            if self._slot is not None:
                log.warning(
                    "exactly-once: the slot is now %s (was %s): its checkpoint is read again",
                    slot.key.decode(),
                    self._slot.key.decode(),
                )
            self._slot = slot
            self._foreign = None
            self._sink.become_transactional(transactional_id(s, server.system_id))
            self._sink.ensure_compacted_topic(s.checkpoint_topic, CHECKPOINT_TOPIC_CONFIG)
            self._stale = True
        if self._stale:
            try:
                self.checkpoint = read_checkpoint(s, slot.key, s.startup_timeout)
            except SinkError as exc:
                if first:
                    raise
                raise TransactionAbortedError(f"the checkpoint could not be read back: {exc}") from exc
            self._stale = False
            log.info(
                "exactly-once: transactional id %s, checkpoint %s in %s under %s",
                self._sink.transactional_id,
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
        self.skipping = False
        self._safe_lsn = self._hold = confirmed
        # An LSN cannot tell two histories with one system identifier and timeline apart (a server restored
        # from a disk snapshot writes new transactions at the LSNs of the lost ones): the skip holds only
        # once the checkpoint's own transaction comes back from the slot. Until then nothing is confirmed
        # past the slot's position, and should the WAL pass the checkpoint without it, nothing is skipped.
        held = checkpoint is not None and bound.lsn == checkpoint.end_lsn > confirmed
        self._verify = checkpoint if held else None

    def begin(self, commit_lsn: int) -> None:
        """A Begin: skip the source transaction when a committed Kafka transaction holds it, else make sure
        a Kafka transaction is open for its events."""
        if self._verify is not None and commit_lsn >= self._verify.end_lsn:
            self._diverged(f"a transaction commits at {format_lsn(commit_lsn)}")
        self.skipping = commit_lsn < self._skip_below
        if self.skipping:
            self.skipped += 1
        elif not self._ktx.open:
            # Nothing is in the new transaction yet: all that is confirmable now stays so.
            self._safe_lsn = max(self._safe_lsn, self._acks.tracker.confirmed_lsn)
            try:
                self._sink.begin_transaction()
            except KafkaException as exc:
                self._abort(self._classify(exc, "begin"))
            self._ktx.begun(time.monotonic())

    def commit(self, txn: Transaction, end_lsn: int, now: float, draining: bool) -> None:
        if self._verify is not None:
            self._read_back(end_lsn, txn.xid, txn.commit_time_us)
        ktx = self._ktx
        if ktx.open:  # the source transaction is whole in the Kafka transaction
            ktx.events += txn.events
            ktx.last_end_lsn = end_lsn
            ktx.last_commit_us = txn.commit_time_us
            ktx.last_xid = txn.xid
            if ktx.due(now, draining=draining):
                self._commit_kafka()

    def tick(self, now: float, draining: bool) -> None:
        if self._ktx.open and self._ktx.due(now, draining=draining):
            self._commit_kafka()  # a quiet stream commits what it has

    def keepalive(self, wal_end: int) -> None:
        verify = self._verify
        if verify is not None and wal_end >= verify.end_lsn:
            self._diverged(f"the server sent its WAL up to {format_lsn(wal_end)}")

    def confirmable(self, acknowledged: int) -> int:
        """No further than the committed Kafka transactions while one is open (its records are acknowledged
        before they are committed), nor past the slot's position while a skip is provisional."""
        if self._ktx.open and acknowledged > self._safe_lsn:
            return self._safe_lsn
        if self._verify is not None and acknowledged > self._hold:
            return self._hold
        return acknowledged

    def end(self, *, whole: bool) -> None:
        """Before the source goes: commit the open Kafka transaction when it holds whole source transactions
        only, else abort it."""
        if not self._ktx.open:
            return
        if whole and not self._pending_failure():
            self._commit_kafka()
            return
        self._abort(TransactionAbortedError("a source transaction was cut short"))

    def failed(self, exc: DeliveryError) -> NoReturn:
        """Timed out, or failed in a way no replay explains, inside a Kafka transaction (which librdkafka
        then holds in its abortable state): nothing of it is read_committed, so abort it and start again
        from the checkpoint, as for a commit that failed."""
        if isinstance(exc, ProducerFencedError):
            raise exc
        self._abort(TransactionAbortedError(exc.message, lsn=exc.lsn))

    def drop(self) -> None:
        """Forget the open Kafka transaction (aborted, or lost with its producer): its records are
        acknowledged but will never be read (read_committed), so the watermark goes back to what committed
        transactions cover."""
        confirmable = self.confirmable(self._acks.tracker.confirmed_lsn)
        if self._ktx.open:
            self._ktx.open = False
            self.aborts += 1
        self._acks.restart(confirmable)
        if self._spans:
            self._end_spans(self._spans, False)
        # An abort taken for failed may have committed (the coordinator finishes what a new producer's
        # init_transactions() finds): what Kafka holds decides what the next session skips.
        self._stale = True

    def shrink_batches(self, topic: str, limit: int) -> NoReturn:
        """A new producer is needed, and the open Kafka transaction cannot move to it: abort it, then
        restart from the checkpoint."""
        if self._ktx.open:
            try:
                self._sink.abort_transaction(self._settings.delivery_timeout)
            except KafkaException as exc:
                log.debug("aborting before a new producer: %s", exc)
        self.drop()
        self._sink.shrink_batches(limit)
        raise TransactionAbortedError(f"topic {topic} takes smaller batches, so the producer was replaced")

    def describe(self) -> str:
        return format_lsn(self.checkpoint.end_lsn) if self.checkpoint else "none"

    def track(self, span: Any) -> bool:
        self._spans.append(span)
        return False  # ended when its Kafka transaction commits, or aborts

    # -- the Kafka transaction -------------------------------------------------------------------------------

    def _commit_kafka(self) -> None:
        """The checkpoint record, then the commit; retried while Kafka says it may be, keeping the slot's
        connection alive. What cannot commit is aborted (TransactionAbortedError: the stream restarts from
        the checkpoint); a fenced producer ends the run."""
        ktx, s, sink = self._ktx, self._settings, self._sink
        checkpoint = None
        if ktx.events:
            server, slot = self._server, self._slot
            assert server is not None and slot is not None  # set before the first Kafka transaction began
            checkpoint = Checkpoint(
                ktx.last_end_lsn, ktx.last_commit_us, server.system_id, server.timeline, ktx.last_xid
            )
            value = checkpoint.encode(slot, database=database_of(s))
            sink.produce_checkpoint(s.checkpoint_topic, slot.key, value, self._committing)
        deadline = time.monotonic() + s.delivery_timeout
        left = self._shutdown_left()
        if left is not None:  # stopping: within shutdown_timeout
            deadline = min(deadline, time.monotonic() + left)
        while True:
            try:
                sink.commit_transaction(COMMIT_WAIT)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retry = isinstance(err, KafkaError) and err.retriable() and not err.txn_requires_abort()
                if retry and time.monotonic() < deadline:
                    self._committing()
                    continue
                self._abort(self._classify(exc, "commit"))
        ktx.open = False
        sink.poll(0)  # the delivery reports of what was committed: the watermark moves
        if self._spans:
            self._end_spans(self._spans, True)
        self.commits += 1
        if checkpoint is not None:
            self.checkpoint = checkpoint
        self._safe_lsn = max(self._safe_lsn, ktx.last_end_lsn)

    def _committing(self) -> None:
        """While the checkpoint waits for room and the commit is retried. Streaming: keep the slot's
        connection alive (which ends the wait when a stop is requested: the shutdown commits again). Stopping:
        go on within shutdown_timeout, and only then give up; a transaction left open would hold every
        read_committed reader of its partitions, the shared checkpoint topic's included, until
        transaction.timeout.ms."""
        left = self._shutdown_left()
        if left is None:
            self._keep_alive()
        elif left <= 0:
            raise StopRequested

    def _classify(self, exc: KafkaException, what: str) -> DeliveryError:
        ktx = self._ktx
        return classify(
            exc,
            what,
            self._sink.transactional_id or "",
            open_for=time.monotonic() - ktx.started if ktx.open else None,
            timeout_ms=self._sink.transaction_timeout_ms,
        )

    def _abort(self, reason: DeliveryError) -> NoReturn:
        """Abort the open Kafka transaction, then raise ``reason``."""
        self.drop()
        if isinstance(reason, ProducerFencedError):
            raise reason
        left = self._shutdown_left()
        try:
            # Stopping: within shutdown_timeout; what is not aborted by then, the next start's producer
            # (init_transactions with the same transactional.id) aborts.
            timeout = self._settings.delivery_timeout if left is None else max(0.1, left)
            self._sink.abort_transaction(timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in FENCED:
                raise self._classify(exc, "abort") from exc
            if left is not None:
                log.warning(
                    "could not abort the Kafka transaction while stopping (%s): the next start does", exc
                )
                raise reason from exc
            log.warning("could not abort the Kafka transaction (%s): a new producer replaces it", exc)
            self._sink.reset()
        raise reason

    # -- is the skip sure? -----------------------------------------------------------------------------------

    def _read_back(self, end_lsn: int, xid: int, commit_time_us: int) -> None:
        """A source transaction ended at ``end_lsn`` while the skip is provisional: the checkpoint's own
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
            self.skipped,
        )

    def _diverged(self, what: str) -> NoReturn:
        verify = self._verify
        assert verify is not None
        self._foreign = verify  # the slot stays held at its position until the next session starts
        raise HistoryDivergedError(
            f"checkpoint {format_lsn(verify.end_lsn)} (transaction {verify.xid} committed at "
            f"{_iso(verify.commit_time_us)}) is not of this server's history: {what} without it. The "
            "server was restored from a copy (a disk snapshot, a VM rollback) and wrote other transactions "
            "at those LSNs; the stream restarts from the slot and skips nothing below the checkpoint",
            lsn=self._hold,
        )


def _iso(epoch_us: int) -> str:
    return datetime.fromtimestamp(epoch_us / 1e6, tz=UTC).isoformat()
