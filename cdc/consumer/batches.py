"""The consumer's batch loop: many records in one database transaction and one offset commit, sized to
take about ``BATCH_SECONDS``; a batch in which a handler fails is replayed record by record.

The handlers of a batch run in psycopg's pipeline mode: their statements are sent without waiting for each
one's result, so a batch costs a few round trips instead of one per statement (a handler that reads a result
still gets it: psycopg syncs when it fetches). In that mode a statement's error surfaces at the next sync
point, which may be inside a later record's handler. So a handler's exception ends the batch at that record
only when it is provably its own (not a database error, and a sync shows every statement so far succeeded);
any other failure rolls the batch back and runs it again without the pipeline, where every error belongs to
the handler that raised it: a record is never blamed, and dead-lettered, for another's failure. That costs
one more handler call for the records of such a batch, which at-least-once handlers allow anyway. A handler
that uses what the pipeline cannot carry (COPY) turns the pipeline off for the consumer's lifetime.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Final

import psycopg

from cdc.avro.deserialize import Event
from cdc.consumer.processed import mark_many
from cdc.consumer.records import Records

log = logging.getLogger("cdc.consumer")

BATCH_SECONDS: Final = 0.25  # the time one batch (one transaction, one offset commit) aims to take


class _BatchEnded(Exception):
    """Internal: the handler raised for the index-th event of a batch."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index, self.error = index, error


class Batches(Records):
    """Batches of records, each in one transaction."""

    def _process_batch(self, records: list[Any]) -> None:
        """Records in as few transactions as possible: a commit (an fsync) per record would bound a
        service to a few hundred events/s. The first record that does not go through cleanly ends the
        batch before it and takes the per-record path (retries, dead letters, crashes) with the error it
        already raised."""
        started, i = time.monotonic(), 0
        while i < len(records) and not self._stop.is_set():
            done, failed = self._apply_batch(records[i:])
            if done:
                self._commit(*records[i : i + done])
            i += done
            if i < len(records) and not self._stop.is_set():
                event, error = failed or (None, None)
                self._process(records[i], event, error)
                i += 1
        if records:
            per_record = (time.monotonic() - started) / len(records)
            self._per_record = (
                per_record if not self._per_record else 0.7 * self._per_record + 0.3 * per_record
            )

    def _next_batch_size(self) -> int:
        # Sized so that a batch takes about BATCH_SECONDS: rebalances and max.poll.interval.ms wait for it.
        if not self._per_record:
            return 1
        return max(1, min(self.batch_size, int(BATCH_SECONDS / self._per_record)))

    def _apply_batch(self, records: list[Any]) -> tuple[int, tuple[Event, BaseException] | None]:
        """``(records committed, (event, error) of the record that ended the batch, if any)``: one
        transaction with every guard row in one statement, then the handler for each new event. A handler
        that raises rolls the whole transaction back; it is done again without that record and those after."""
        events: list[Event] = []
        for message in records:
            try:
                event = self.deserializer(message)
            except Exception:  # undecodable, or the registry is down: the per-record path decides
                break
            if not event.id:
                break
            events.append(event)
        failed: tuple[Event, BaseException] | None = None
        pipelined = self._pipelined and len(events) > 1
        while events:
            try:
                handled = self._transaction(events, pipelined=pipelined)
            except _BatchEnded as ended:
                failed, events = (events[ended.index], ended.error), events[: ended.index]
                continue
            except Exception as exc:
                if pipelined:  # which record failed is not known: done again without the pipeline
                    pipelined = False
                    self._unpipelined(len(events), exc)
                    continue
                return 0, (events[0], exc)  # the guard statement itself (a deadlock, a lost connection)
            self._count_batch(events, handled)
            return len(events), failed
        return 0, failed

    def _transaction(self, events: list[Event], *, pipelined: bool) -> set[str]:
        """The guard rows of ``events`` and the handlers of the new ones, in one transaction: the ids
        handled. Raises _BatchEnded for the handler that raised when that handler is known to be the one
        that failed; in pipeline mode it may not be, and the error is raised as it is."""
        assert self._conn is not None, "run() opens the connection"
        with self._conn.transaction():
            new = mark_many(self._conn, self.table, [e.id for e in events], self.name)
            handled: set[str] = set()
            with self._conn.pipeline() if pipelined else contextlib.nullcontext() as pipeline:
                for index, event in enumerate(events):
                    if event.id in new and event.id not in handled:
                        try:
                            self.handler(self._conn, event)
                        except Exception as exc:
                            if pipeline is not None and not self._own_error(pipeline, exc):
                                raise
                            raise _BatchEnded(index, exc) from exc
                        handled.add(event.id)
        return handled

    def _own_error(self, pipeline: psycopg.Pipeline, exc: Exception) -> bool:
        """Whether a handler's exception in pipeline mode is its own: not a database error (which may be an
        earlier statement's, surfacing at this handler's fetch), and every statement so far succeeded."""
        assert self._conn is not None
        if isinstance(exc, psycopg.Error):
            return False
        try:
            pipeline.sync()
        except psycopg.Error:
            return False
        return self._conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR

    def _unpipelined(self, size: int, error: BaseException) -> None:
        if isinstance(error, psycopg.NotSupportedError):
            self._pipelined = False
            log.warning(
                "consumer %s: a handler used what psycopg's pipeline mode cannot carry (%s);"
                " batches go on without the pipeline",
                self.name,
                type(error).__name__,
            )
        log.info(
            "consumer %s: a pipelined batch of %d records failed (%s); done again without the pipeline",
            self.name,
            size,
            type(error).__name__,
        )

    def _count_batch(self, events: list[Event], handled: set[str]) -> None:
        counted: set[str] = set()
        for event in events:  # an id twice in one batch: the second is a duplicate
            self._count(event, event.id in handled and event.id not in counted)
            counted.add(event.id)
