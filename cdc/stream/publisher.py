"""The publisher: what a delivery mode does around the records, chosen once when the pipeline is built.

The hot loop never asks which mode it is in. It tells the publisher where the stream is (a source
transaction begins, commits, a keepalive comes, the loop turns, the source goes) and asks it two things:
whether the source transaction being read is to be skipped (:attr:`Publisher.skipping`, an attribute read
per event), and how far the slot may be confirmed given what Kafka acknowledged (:meth:`confirmable`).

- :class:`AtLeastOnce` (here): records are produced as they come; what Kafka acknowledged may be confirmed.
- :class:`cdc.stream.exactly_once.ExactlyOnce`: Kafka transactions around whole source transactions, the
  checkpoint record inside each, the WAL-history identity and the skip point.

Producing a record is the same in both (:mod:`cdc.stream.sender`): an exactly-once publisher has opened the
Kafka transaction at the source transaction's Begin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from cdc.errors import DeliveryError
from cdc.stream.checkpoint import Transaction
from cdc.stream.identity import ServerIdentity, SlotIdentity
from cdc.stream.sink import KafkaSink


class Publisher(Protocol):
    """One delivery mode. ``skipping``: drop the events of the source transaction being read (a committed
    Kafka transaction holds it already)."""

    skipping: bool
    commits: int  # Kafka transactions committed
    aborts: int  # Kafka transactions aborted
    skipped: int  # source transactions skipped as already in Kafka

    def start(self, server: ServerIdentity, slot: SlotIdentity, *, first: bool, confirmed: int) -> None:
        """A session begins on ``server``'s WAL, the slot confirmed up to ``confirmed``."""

    def begin(self, commit_lsn: int) -> None:
        """A source transaction that commits at ``commit_lsn`` begins."""

    def commit(self, txn: Transaction, end_lsn: int, now: float, draining: bool) -> None:
        """The source transaction ``txn`` committed (its Commit message, ending at ``end_lsn``)."""

    def tick(self, now: float, draining: bool) -> None:
        """The loop turned between two source transactions."""

    def keepalive(self, wal_end: int) -> None:
        """The server sent everything up to ``wal_end``, between two source transactions."""

    def confirmable(self, acknowledged: int) -> int:
        """How far the slot may be confirmed, Kafka having acknowledged up to ``acknowledged``."""

    def end(self, *, whole: bool) -> None:
        """The source goes (a lost connection, a stop): ``whole`` when no source transaction is half read."""

    def failed(self, exc: DeliveryError) -> NoReturn:
        """A delivery failed (not a refusal, not a denied right): raise what the run does about it."""

    def drop(self) -> None:
        """What was produced is thrown away: a replay after Kafka refused records follows."""

    def shrink_batches(self, topic: str, limit: int) -> None:
        """``topic`` takes smaller batches than the producer makes: a producer whose batches fit it."""

    def describe(self) -> str:
        """Where the mode stands, for a log line (the checkpoint, in exactly-once)."""

    def track(self, span: Any) -> bool:
        """A traced record's span (cdc.stream.spans): True when it ends at the record's acknowledgement,
        False when the publisher ends it (with its Kafka transaction)."""


class AtLeastOnce:
    """Records are produced as they come; the slot is confirmed as far as Kafka acknowledged. A failed
    delivery ends the run without confirming past it, and a restart resumes from the slot."""

    skipping = False  # never: what the slot replays is published again, and consumers drop it by id

    def __init__(self, sink: KafkaSink, until_empty: Callable[[], None]) -> None:
        self._sink = sink
        self._until_empty = until_empty
        self.commits = self.aborts = self.skipped = 0

    def start(self, server: ServerIdentity, slot: SlotIdentity, *, first: bool, confirmed: int) -> None:
        pass

    def begin(self, commit_lsn: int) -> None:
        pass

    def commit(self, txn: Transaction, end_lsn: int, now: float, draining: bool) -> None:
        pass

    def tick(self, now: float, draining: bool) -> None:
        pass

    def keepalive(self, wal_end: int) -> None:
        pass

    def confirmable(self, acknowledged: int) -> int:
        return acknowledged

    def end(self, *, whole: bool) -> None:
        pass

    def failed(self, exc: DeliveryError) -> NoReturn:
        raise exc

    def drop(self) -> None:
        pass

    def shrink_batches(self, topic: str, limit: int) -> None:
        self._until_empty()  # what is queued was batched for the old size
        self._sink.shrink_batches(limit)

    def describe(self) -> str:
        return "at-least-once"

    def track(self, span: Any) -> bool:
        return True  # acknowledged is final
