"""Which WAL position may be confirmed to the slot: a contiguous low watermark over acknowledged transactions.

Events are produced as soon as they are decoded, long before their transaction's Commit message arrives,
and Kafka acknowledges them in whatever order its partitions answer. A transaction's commit end LSN may
be confirmed only when that transaction *and every earlier one* has been committed on our side (its
Commit message was read) and every event it produced has been acknowledged. The tracker keeps the
transactions in commit order and moves the watermark over the prefix that is complete.

When nothing is open or outstanding, the keepalives' ``wal_end`` is confirmed too, so that a slot whose
publication sees no traffic does not pin WAL written by the rest of the cluster (guarantee 5).

This module is pure bookkeeping: no I/O, no Kafka import. ``Transaction.delivered`` has the signature of a
confluent-kafka delivery callback so the sink can hand it over as it is, without a closure per event.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from cdc.errors import CheckpointError
from cdc.stream.refusals import REFUSAL_CODES, error_code, record_digest

IMPLICIT_ACK = (
    "librdkafka reported it delivered without an offset (an implicit acknowledgement, not a broker's)"
)


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """The first delivery that Kafka refused. The pipeline stops on it without confirming past it."""

    error: object
    xid: int
    commit_lsn: int


class AckLatency:
    """Commit-to-ack latency in 1 ms buckets up to 60 s (and one above): constant memory for a process
    that runs for months, exact enough for p50/p99. Fed once per transaction, weighted by its events, with
    the time its *last* event was acknowledged: an upper bound for each of its events."""

    LIMIT_MS = 60_000

    def __init__(self) -> None:
        self.counts = [0] * (self.LIMIT_MS + 2)
        self.total = 0
        self.sum_ms = 0
        self.max_ms = 0

    def record(self, latency_ms: int, events: int) -> None:
        bucket = min(max(latency_ms, 0), self.LIMIT_MS + 1)
        self.counts[bucket] += events
        self.total += events
        self.sum_ms += latency_ms * events
        if latency_ms > self.max_ms:
            self.max_ms = latency_ms

    def percentile(self, q: float) -> int | None:
        """The smallest latency in ms that at least ``q`` (0..1) of the events did not exceed."""
        if not self.total:
            return None
        rank = q * self.total
        seen = 0
        for ms, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return ms
        return self.max_ms  # pragma: no cover - the loop always reaches the total


class Transaction:
    """One source transaction: how many of its events Kafka has yet to acknowledge."""

    __slots__ = (
        "xid",
        "commit_lsn",
        "commit_time_us",
        "end_lsn",
        "events",
        "outstanding",
        "committed",
        "_tracker",
    )

    def __init__(self, tracker: AckTracker, xid: int, commit_lsn: int, commit_time_us: int) -> None:
        self.xid = xid
        self.commit_lsn = commit_lsn
        self.commit_time_us = commit_time_us
        self.end_lsn = 0
        self.events = 0
        self.outstanding = 0
        self.committed = False
        self._tracker = tracker

    def sent(self) -> None:
        """One more event of this transaction was handed to the producer."""
        self.events += 1
        self.outstanding += 1
        self._tracker.in_flight += 1

    def delivered(self, err: object, msg: Any = None) -> None:
        """Delivery report for one event: ``err`` is None on success (confluent-kafka's callback shape).

        A success without an offset is not taken for one: librdkafka reports records "implicitly acked by
        subsequent batch success" that way, and a broker can append the later batch without them (see
        ``cdc.stream.kafka_config.FIXED_PRODUCER_CONFIG``, which keeps that from happening). Stopping costs
        duplicates;
        confirming past it could cost the event."""
        tracker = self._tracker
        if err is None and msg is not None and msg.offset() is None:
            err = IMPLICIT_ACK
        if err is not None:
            if tracker.failure is None:
                tracker.failure = DeliveryFailure(err, self.xid, self.commit_lsn)
            if msg is not None and error_code(err) in REFUSAL_CODES:
                tracker.refused.append((record_digest(msg.topic(), msg.key(), msg.value()), err))
            # A failed event stays outstanding forever: the watermark must never pass it.
            return
        self.outstanding -= 1
        tracker.in_flight -= 1
        tracker.acked_events += 1
        if self.outstanding == 0 and self.committed:
            self.acked()
            tracker.advance()

    def acked(self) -> None:
        """Every event of this committed transaction is acknowledged: note how long it took."""
        if self.events:
            now_ms = time.time_ns() // 1_000_000
            self._tracker.latency.record(now_ms - self.commit_time_us // 1000, self.events)


class AckTracker:
    """The contiguous low watermark of fully acknowledged transactions.

    ``confirmed_lsn`` only ever grows. ``in_flight`` counts events produced and not yet acknowledged.
    """

    def __init__(self, confirmed_lsn: int = 0, *, latency: AckLatency | None = None) -> None:
        self.confirmed_lsn = confirmed_lsn
        self.in_flight = 0
        self.acked_events = 0
        self.failure: DeliveryFailure | None = None
        # Records the broker refused as their own fault (too large, invalid): digest and error.
        self.refused: list[tuple[bytes, object]] = []
        self.latency = latency if latency is not None else AckLatency()
        self._pending: deque[Transaction] = deque()
        self._open: Transaction | None = None
        # (end LSN, commit time in µs) of the last acknowledged transaction that held events: what
        # cdc.stream.progress saves for `cdc recover`.
        self.last_outbox: tuple[int, int] = (0, 0)

    def begin(self, xid: int, commit_lsn: int, commit_time_us: int) -> Transaction:
        """A Begin message: the transaction whose events follow. Transactions arrive in commit order."""
        if self._open is not None:
            raise CheckpointError(
                f"transaction {xid} began while transaction {self._open.xid} is still open",
                lsn=commit_lsn,
            )
        txn = Transaction(self, xid, commit_lsn, commit_time_us)
        self._open = txn
        self._pending.append(txn)
        return txn

    def commit(self, txn: Transaction, end_lsn: int) -> None:
        """The transaction's Commit message: from now on only its acknowledgements are awaited."""
        if txn is not self._open:
            raise CheckpointError(f"commit of transaction {txn.xid}, which is not the open one", lsn=end_lsn)
        self._open = None
        txn.end_lsn = end_lsn
        txn.committed = True
        if txn.outstanding == 0:
            txn.acked()
            self.advance()

    def keepalive(self, wal_end: int) -> bool:
        """A keepalive from the server. When nothing is open or outstanding, everything up to ``wal_end`` is
        done as far as this slot is concerned. Returns whether the watermark moved."""
        if self.idle and wal_end > self.confirmed_lsn:
            self.confirmed_lsn = wal_end
            return True
        return False

    @property
    def idle(self) -> bool:
        return self._open is None and not self._pending

    def advance(self) -> None:
        """Move the watermark over the prefix of transactions that are complete."""
        pending = self._pending
        confirmed = self.confirmed_lsn
        while pending:
            head = pending[0]
            if not head.committed or head.outstanding:
                break
            pending.popleft()
            if head.end_lsn > confirmed:
                confirmed = head.end_lsn
            if head.events:
                self.last_outbox = (head.end_lsn, head.commit_time_us)
        self.confirmed_lsn = confirmed


class Acks:
    """The tracker of the current session, replaced (never reset in place) when a session starts again or
    a Kafka transaction is dropped; its latency histogram lives as long as the pipeline."""

    def __init__(self) -> None:
        self.latency = AckLatency()
        self.tracker = AckTracker(latency=self.latency)

    def restart(self, confirmed_lsn: int) -> AckTracker:
        self.tracker = AckTracker(confirmed_lsn, latency=self.latency)
        return self.tracker


class SourceTransaction:
    """The source transaction being read: set at its Begin, cleared at its Commit. What every record of it
    carries (its commit LSN and xid as header bytes, its commit time as the Kafka timestamp), and the
    bookkeeping its records are acknowledged against."""

    __slots__ = ("txn", "lsn", "xid", "ts_ms")

    def __init__(self) -> None:
        self.txn: Transaction | None = None
        self.lsn = b""
        self.xid = b""
        self.ts_ms = 0

    def begin(self, txn: Transaction, lsn: bytes, xid: bytes, ts_ms: int) -> None:
        self.txn, self.lsn, self.xid, self.ts_ms = txn, lsn, xid, ts_ms
