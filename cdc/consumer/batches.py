"""The consumer's batch path: many records in one database transaction and one offset commit, sized to take
about ``BATCH_SECONDS``; the record at which a batch fails takes the per-record path.

:class:`Batches` owns what it learns while it runs: the time a record takes (which sizes the next batch),
whether the handlers may run in psycopg's pipeline mode, and whether the guard rows may be written before the
records are decoded. It gets everything else in its constructor: the service's connection and handlers, the
per-record path (``one_by_one``, :meth:`cdc.consumer.records.Records.process`) for the record that ends a
batch, ``counted`` for each event's outcome, ``done`` to commit past the records a batch finished, and the
stop event.

The handlers of a batch run in psycopg's pipeline mode: their statements are sent without waiting for each
one's result, so a batch costs a few round trips instead of one per statement (a handler that reads a result
still gets it: psycopg syncs when it fetches). In that mode a statement's error surfaces at the next sync
point, which may be inside a later record's handler. So a handler's exception ends the batch at that record
only when it is provably its own (not a database error, and a sync shows every statement so far succeeded);
any other failure rolls the batch back and runs it again without the pipeline, where every error belongs to
the handler that raised it: a record is never blamed, and dead-lettered, for another's failure. That costs
one more handler call for the records of such a batch, which at-least-once handlers allow anyway. A handler
that uses what the pipeline cannot carry (COPY) turns the pipeline off for the consumer's lifetime.

The guard statement of a batch's first attempt is sent with the ids of the records' ``id`` headers before
the records are decoded, so that PostgreSQL writes the guard rows while this process decodes (the two took
about as long, one after the other). A record that cannot be decoded rolls that transaction back, and so
does an event whose id is not its header's (a deserializer of the service's own; the consumer then decodes
first from then on): the batch is then done as before, decoded first.

A batch handler (``batch_handler=``) is called once per batch with its new events, outside the pipeline
(executemany pipelines itself; COPY cannot be pipelined). Its exception does not say which event failed: the
batch is halved until the failing event is alone, then that event ends the batch like a handler's would.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg

from cdc.avro.deserialize import Event, KafkaMessage
from cdc.config import TableRef
from cdc.consumer.processed import mark_many, send_mark_many
from cdc.consumer.records import BatchHandler, Handler
from cdc.consumer.spans import HandlerSpans, processed

log = logging.getLogger("cdc.consumer")

BATCH_SECONDS: Final = 0.25  # the time one batch (one transaction, one offset commit) aims to take


class _BatchEnded(Exception):
    """Internal: the handler raised for the index-th event of a batch."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index, self.error = index, error


class _Undecodable(Exception):
    """Internal: a record could not be decoded while its batch's guard rows were being written early."""


class _Halve(Exception):
    """Internal: the batch handler raised for a batch of several new events; which one is to blame is not
    known."""


class Batches:
    """Batches of records, each in one transaction of ``conn`` (autocommit: each ``transaction()`` commits).

    ``batch_handler`` (or else ``handler``, once per new event) makes the effects; ``pipeline`` lets the
    handlers run in psycopg's pipeline mode."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        handler: Handler,
        batch_handler: BatchHandler | None,
        deserializer: Callable[[KafkaMessage], Event],
        table: TableRef,
        name: str,
        batch_size: int,
        pipeline: bool,
        one_by_one: Callable[[Any, Event | None, BaseException | None], None],
        counted: Callable[[Event, bool], None],
        done: Callable[..., None],
        stop: threading.Event,
        spans: HandlerSpans | None = None,
    ) -> None:
        self._conn = conn
        self._spans = spans  # None: no OpenTelemetry, no span
        self._handler = handler
        self._batch_handler = batch_handler
        self._deserializer = deserializer
        self._table = table
        self._name = name
        self._batch_size = batch_size
        self._one_by_one = one_by_one
        self._counted = counted
        self._done = done
        self._stop = stop
        self._per_record = 0.0  # seconds per record, a moving average: sizes the next batch
        self._pipelined = pipeline  # off for good once a handler used what the pipeline cannot carry
        self._early_guard = True  # off for good once an event's id was not its header's

    def next_size(self) -> int:
        """How many records the next batch should take: about BATCH_SECONDS' worth, so that rebalances and
        max.poll.interval.ms never wait long for it; 1 until a batch was timed."""
        if not self._per_record:
            return 1
        return max(1, min(self._batch_size, int(BATCH_SECONDS / self._per_record)))

    def process(self, records: list[Any]) -> None:
        """Records in as few transactions as possible: a commit (an fsync) per record would bound a
        service to a few hundred events/s. The first record that does not go through cleanly ends the
        batch before it and takes the per-record path (retries, dead letters, crashes) with the error it
        already raised."""
        started, i = time.monotonic(), 0
        while i < len(records) and not self._stop.is_set():
            done, failed = self._apply_batch(records[i:])
            if done:
                self._done(*records[i : i + done])
            i += done
            # The record after a committed prefix takes the per-record path when it failed, or when it
            # could not join a batch (undecodable); after a halved batch the rest is a batch again.
            if i < len(records) and not self._stop.is_set() and (failed is not None or not done):
                event, error = failed or (None, None)
                self._one_by_one(records[i], event, error)
                i += 1
        if records:
            per_record = (time.monotonic() - started) / len(records)
            self._per_record = (
                per_record if not self._per_record else 0.7 * self._per_record + 0.3 * per_record
            )

    def _apply_batch(self, records: list[Any]) -> tuple[int, tuple[Event, BaseException] | None]:
        """``(records committed, (event, error) of the record that ended the batch, if any)``: one
        transaction with every guard row in one statement, then the handler for each new event. A handler
        that raises rolls the whole transaction back; it is done again without that record and those after.

        The first attempt sends the guard statement with the ids of the records' ``id`` headers before it
        decodes them, so that PostgreSQL writes the guard rows while this process decodes (_early_guard)."""
        ids = _header_ids(records) if self._early_guard and len(records) > 1 else None
        events: list[Event] = [] if ids is not None else self._decoded(records)
        failed: tuple[Event, BaseException] | None = None
        pipelined = self._pipelined and len(records) > 1 and self._batch_handler is None
        while events or ids is not None:
            early, ids = (None if ids is None else (records, ids)), None
            try:
                handled = self._transaction(events, pipelined=pipelined, early=early)
            except _Undecodable:  # rolled back: decoded first, as without the early guard
                events = self._decoded(records)
                continue
            except _BatchEnded as ended:
                failed, events = (events[ended.index], ended.error), events[: ended.index]
                continue
            except _Halve as halve:
                log.info(
                    "consumer %s: the batch handler raised %s for %d events; the first half is done again",
                    self._name,
                    type(halve.__cause__).__name__,
                    len(events),
                )
                events = events[: len(events) // 2]
                continue
            except Exception as exc:
                if not events:  # the early guard failed before a record was decoded: again, decoded first
                    events = self._decoded(records)
                    continue
                if pipelined:  # which record failed is not known: done again without the pipeline
                    pipelined = False
                    self._unpipelined(len(events), exc)
                    continue
                return 0, (events[0], exc)  # the guard statement itself (a deadlock, a lost connection)
            self._count_batch(events, handled)
            return len(events), failed
        return 0, failed

    def _decoded(self, records: list[Any]) -> list[Event]:
        """The events of the records up to the first that cannot be decoded or has no id (the per-record
        path decides about that one: undecodable, or the registry is down)."""
        events: list[Event] = []
        for message in records:
            try:
                event = self._deserializer(message)
            except Exception:
                break
            if not event.id:
                break
            events.append(event)
        return events

    def _transaction(
        self,
        events: list[Event],
        *,
        pipelined: bool,
        early: tuple[list[Any], list[str]] | None = None,
    ) -> set[str]:
        """The guard rows of ``events`` and the handlers of the new ones, in one transaction: the ids
        handled. Raises _BatchEnded for the handler that raised when that handler is known to be the one
        that failed; in pipeline mode it may not be, and the error is raised as it is. With ``early``
        (records, their header ids), ``events`` is empty and filled here, decoded while the guard runs.
        The one place where a batch runs the service's handler, once per new event."""
        with self._conn.transaction():
            if early is not None:
                new = self._guard_while_decoding(*early, events)
            else:
                new = mark_many(self._conn, self._table, [e.id for e in events], self._name)
            if self._batch_handler is not None:
                return self._batch_effects(events, new)
            handled: set[str] = set()
            spans = self._spans
            with self._conn.pipeline() if pipelined else contextlib.nullcontext() as pipeline:
                for index, event in enumerate(events):
                    if event.id in new and event.id not in handled:
                        try:
                            scope = None if spans is None else spans.processing(event)
                            if scope is None:
                                self._handler(self._conn, event)
                            else:
                                with scope as span:
                                    processed(span, duplicate=False)
                                    self._handler(self._conn, event)
                        except Exception as exc:
                            if pipeline is not None and not self._own_error(pipeline, exc):
                                raise
                            raise _BatchEnded(index, exc) from exc
                        handled.add(event.id)
        return handled

    def _guard_while_decoding(self, records: list[Any], ids: list[str], events: list[Event]) -> set[str]:
        """Send the guard statement for ``ids``, decode ``records`` into ``events`` while PostgreSQL runs
        it, then read which ids are new. _Undecodable when a record cannot be decoded or its event's id is
        not its header's (a deserializer of the service's own: then never again)."""
        with self._conn.pipeline():
            sent = send_mark_many(self._conn, self._table, ids, self._name)
            for message, expected in zip(records, ids, strict=True):
                try:
                    event = self._deserializer(message)
                except Exception:
                    raise _Undecodable() from None
                if event.id != expected:
                    self._early_guard = False
                    raise _Undecodable()
                events.append(event)
            return {row[0] for row in sent.fetchall()}

    def _batch_effects(self, events: list[Event], new: set[str]) -> set[str]:
        """The batch handler, once, for the new events (each id once, in the order read): the ids handled.
        When it raises, the event to blame is known only when there was one new event (_BatchEnded);
        otherwise _Halve: the batch is done again in halves until the failing event is alone. The one place
        where the service's batch handler runs."""
        assert self._batch_handler is not None
        fresh: list[Event] = []
        handled: set[str] = set()
        for event in events:
            if event.id in new and event.id not in handled:
                fresh.append(event)
                handled.add(event.id)
        if fresh:
            try:
                if self._spans is None:
                    self._batch_handler(self._conn, fresh)
                else:
                    with self._spans.batch(fresh):
                        self._batch_handler(self._conn, fresh)
            except Exception as exc:
                if len(fresh) == 1:
                    raise _BatchEnded(events.index(fresh[0]), exc) from exc
                raise _Halve() from exc
        return handled

    def _own_error(self, pipeline: psycopg.Pipeline, exc: Exception) -> bool:
        """Whether a handler's exception in pipeline mode is its own: not a database error (which may be an
        earlier statement's, surfacing at this handler's fetch), and every statement so far succeeded."""
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
                self._name,
                type(error).__name__,
            )
        log.info(
            "consumer %s: a pipelined batch of %d records failed (%s); done again without the pipeline",
            self._name,
            size,
            type(error).__name__,
        )

    def _count_batch(self, events: list[Event], handled: set[str]) -> None:
        counted: set[str] = set()
        for event in events:  # an id twice in one batch: the second is a duplicate
            self._counted(event, event.id in handled and event.id not in counted)
            counted.add(event.id)


def _header_ids(records: list[Any]) -> list[str] | None:
    """The first ``id`` header of each record, as EventDeserializer reads it; None when one has none."""
    ids: list[str] = []
    for message in records:
        for key, value in message.headers() or ():
            if key == "id":
                if not value:
                    return None
                ids.append(value.decode("utf-8", "replace"))
                break
        else:
            return None
    return ids
