"""The per-record path of the consumer: decode, run the handler in the service's transaction, retry a
transient failure with bounded backoff, dead-letter what can never be processed.

:class:`Records` owns one record's way through; its state is only what its constructor is given. It takes
the records that could not go through in a batch (:mod:`cdc.consumer.batches` hands them over, with the error
a record's first attempt raised there), so this is where retries, dead letters and crashes are decided, with
the rules of :mod:`cdc.consumer.failures`:

- a record that cannot be decoded, or whose handler raised a PermanentError (or a RetryableError past the
  policy, with ``on_retries_exhausted = "dead_letter"``), goes to the service's dead-letter topic
  (``dead_letter``, :class:`cdc.consumer.dead_letters.DeadLetters`) and is finished;
- a RetryableError is retried within the policy, sleeping on the stop event (a stop ends the wait and leaves
  the record unacknowledged, to be read again);
- anything else rolls back and propagates, so the offset is not committed.

A finished record is reported to ``done`` (:meth:`cdc.consumer.session.Session.done`), which commits past it.
:meth:`Records.counted` is the one place an event's outcome (new, or a duplicate the guard row caught) is
counted and a duplicate logged, for this path and the batches'.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

import psycopg

from cdc.avro.deserialize import Event, KafkaMessage
from cdc.config import TableRef
from cdc.consumer.failures import RetryPolicy, classify, error_name, record_at
from cdc.consumer.processed import mark_processed
from cdc.consumer.spans import HandlerSpans, processed
from cdc.errors import (
    DeserializationError,
    PermanentError,
    RegistryUnavailableError,
    RetriesExhaustedError,
)
from cdc.logs import shown

log = logging.getLogger("cdc.consumer")

Handler = Callable[[psycopg.Connection[Any], Event], None]
# The new events of a batch, in the order read, each once: one executemany or COPY for all of them.
BatchHandler = Callable[[psycopg.Connection[Any], list[Event]], None]


class Records:
    """One record at a time, in the transactions of ``conn`` (autocommit: each ``transaction()`` commits).

    ``dead_letter(message, exc, where)`` writes a record's dead letter; ``done(message)`` commits past a
    finished record; ``stop`` is set to stop (a retry's sleep ends with it); ``counts`` gets ``processed``,
    ``duplicate`` and ``retried``."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        handler: Handler,
        deserializer: Callable[[KafkaMessage], Event],
        table: TableRef,
        name: str,
        retry: RetryPolicy,
        on_retries_exhausted: Literal["stop", "dead_letter"],
        dead_letter: Callable[[Any, BaseException, str | None], None],
        done: Callable[..., None],
        stop: threading.Event,
        counts: dict[str, int],
        spans: HandlerSpans | None = None,
    ) -> None:
        self._conn = conn
        self._spans = spans  # None: no OpenTelemetry, no span
        self._handler = handler
        self._deserializer = deserializer
        self._table = table
        self._name = name
        self._retry = retry
        self._on_retries_exhausted = on_retries_exhausted
        self._dead_letter = dead_letter
        self._done = done
        self._stop = stop
        self._counts = counts

    def process(
        self, message: Any, event: Event | None = None, first_error: BaseException | None = None
    ) -> None:
        """One record on its own; ``event`` when it is decoded already, and ``first_error``: what its first
        attempt (in a batch) raised."""
        if event is not None:
            return self._handle(message, event, first_error)
        try:
            event = self._deserialize(message)
            if event is None:
                return None  # stopping while the schema registry was down: read again after a restart
            if not event.id:
                raise PermanentError(
                    "the record has no 'id' header: nothing to deduplicate on", reason="no_id"
                )
        except (DeserializationError, PermanentError) as exc:
            self._dead_letter(message, exc, None)
            return self._done(message)
        return self._handle(message, event, None)

    def counted(self, event: Event, new: bool) -> None:
        """Count ``event`` as processed (its guard row was new) or as a duplicate (acknowledged without
        calling the handler)."""
        self._counts["processed" if new else "duplicate"] += 1
        if not new:
            log.info(
                "event %s was processed before: acknowledged without calling the handler", shown(event.id)
            )

    def _handle(self, message: Any, event: Event, first_error: BaseException | None) -> None:
        attempt, error = 1, first_error
        while True:
            try:
                if error is not None:
                    raise error
                new = self._apply(event)
                break
            except Exception as exc:
                error = None
                what = classify(exc)
                where = f"event {shown(event.id)} ({shown(event.event_type)}) at {record_at(message)}"
                if what == "crash":
                    log.error(
                        "handler failed on %s: %s; rolled back, offset not committed", where, error_name(exc)
                    )
                    raise
                if what == "retry" and attempt < self._retry.attempts:
                    delay = self._retry.delay(attempt)
                    log.warning(
                        "%s: %s, attempt %d; retrying in %.2f s", where, error_name(exc), attempt, delay
                    )
                    self._counts["retried"] += 1
                    attempt += 1
                    if self._stop.wait(delay):
                        log.info("stopping during a retry of %s: left uncommitted, to be read again", where)
                        return None
                    continue
                final: BaseException = exc
                if what == "retry":
                    final = RetriesExhaustedError(f"{where}: still failing after {attempt} attempts: {exc}")
                    if self._on_retries_exhausted == "stop":
                        log.error("%s: %s; stopping, offset not committed", where, error_name(final))
                        raise final from exc
                self._dead_letter(message, final, where)
                return self._done(message)
        self.counted(event, new)
        return self._done(message)

    def _deserialize(self, message: Any) -> Event | None:
        """The event; a schema registry that does not answer is waited for within the retry policy (the
        record is not to blame), then RegistryUnavailableError stops the consumer, offset not committed."""
        attempt = 1
        while True:
            try:
                return self._deserializer(message)
            except RegistryUnavailableError as exc:
                if attempt >= self._retry.attempts:
                    raise
                delay = self._retry.delay(attempt)
                where = record_at(message)
                log.warning("%s at %s; attempt %d, retrying in %.2f s", exc, where, attempt, delay)
                attempt += 1
                if self._stop.wait(delay):
                    return None

    def _apply(self, event: Event) -> bool:
        """One transaction: the guard row, and the handler when the row is new. True when it was new. The
        one place where the per-record path runs the service's handler."""
        scope = None if self._spans is None else self._spans.processing(event)
        if scope is None:
            with self._conn.transaction():
                new = mark_processed(self._conn, self._table, event.id, self._name)
                if new:
                    self._handler(self._conn, event)
            return new
        with scope as span, self._conn.transaction():
            new = mark_processed(self._conn, self._table, event.id, self._name)
            processed(span, duplicate=not new)
            if new:
                self._handler(self._conn, event)
        return new
