"""The per-record path of the consumer: decode, run the handler in the service's transaction, retry a
transient failure with bounded backoff, dead-letter what can never be processed.

A record that cannot be decoded, or whose handler raised a PermanentError (or a RetryableError past the
policy, with ``on_retries_exhausted = "dead_letter"``), goes to the service's dead-letter topic, reduced when
it is too large for it; anything else rolls back and propagates, so the offset is not committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Final, Literal

import psycopg
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc.avro.deserialize import Event, KafkaMessage
from cdc.config import TableRef
from cdc.consumer.failures import (
    RetryPolicy,
    classify,
    dead_letter_records,
    error_reason,
)
from cdc.consumer.processed import mark_processed
from cdc.errors import (
    ConsumerError,
    DeserializationError,
    PermanentError,
    RegistryUnavailableError,
    RetriesExhaustedError,
)
from cdc.logs import shown

log = logging.getLogger("cdc.consumer")

# A record the producer (message.max.bytes) or the dead-letter topic (max.message.bytes) refuses for its size.
_TOO_LARGE: Final = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)

Handler = Callable[[psycopg.Connection[Any], Event], None]
# The new events of a batch, in the order read, each once: one executemany or COPY for all of them.
BatchHandler = Callable[[psycopg.Connection[Any], list[Event]], None]


class Records:
    """One record at a time; and the state every part of the consumer reads (set by its ``__init__``)."""

    _conf: dict[str, Any]
    _conn: psycopg.Connection[Any] | None
    _consumer: Any
    _database_url: str
    _early_guard: bool
    _hard_deadline: bool
    _pending: dict[tuple[str, int], int]
    _per_record: float
    _pipelined: bool
    _producer: Any
    _producer_conf: dict[str, Any]
    _stop: threading.Event
    _watchdog: threading.Timer | None
    batch_handler: BatchHandler | None
    batch_size: int
    counts: dict[str, int]
    deserializer: Callable[[KafkaMessage], Event]
    dlq_topic: str
    handler: Handler
    name: str
    on_retries_exhausted: Literal["stop", "dead_letter"]
    poll_timeout: float
    retry: RetryPolicy
    shutdown_timeout: float
    table: TableRef
    topics: list[str]

    def _commit(self, *messages: Any) -> None:
        """Commit past ``messages`` (a batch may span partitions: each one's offset is noted, in order).

        Asynchronously: the records' effects are already committed in the database, so the offset only
        saves a redelivery (which the guard rows acknowledge as a duplicate), and waiting for the broker
        cost each batch a round trip (about a tenth of its time). An offset stays pending until the broker
        confirms it (:meth:`_on_committed`); a revocation and the consumer's close commit what is pending
        synchronously."""
        for message in messages:
            self._pending[(message.topic(), message.partition())] = message.offset() + 1
        self._commit_pending(list(self._pending), asynchronous=True)

    def _commit_pending(self, keys: list[tuple[str, int]], *, asynchronous: bool = False) -> None:
        offsets = [TopicPartition(t, p, self._pending[(t, p)]) for t, p in keys if (t, p) in self._pending]
        if not offsets:
            return
        try:
            done = self._consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as exc:
            # Safe to leave: the database already holds the guard row, so a redelivery is a duplicate.
            self._on_committed(exc.args[0], [])
            return
        if not asynchronous:
            self._on_committed(None, done or offsets)

    def _on_committed(self, error: KafkaError | None, partitions: list[Any]) -> None:
        """What the broker confirmed is no longer pending (librdkafka's ``on_commit``, served by
        ``consume()``; and the result of a synchronous commit). A failed commit stays pending: the next
        one carries it."""
        if error is not None:
            log.warning("offset commit failed (%s): retried with the next commit", error.str())
            return
        for tp in partitions:
            if tp.error is None and self._pending.get((tp.topic, tp.partition)) == tp.offset:
                del self._pending[(tp.topic, tp.partition)]

    def _count(self, event: Event, new: bool) -> None:
        self.counts["processed" if new else "duplicate"] += 1
        if not new:
            log.info(
                "event %s was processed before: acknowledged without calling the handler", shown(event.id)
            )

    def _process(
        self, message: Any, event: Event | None = None, first_error: BaseException | None = None
    ) -> None:
        """One record on its own; ``first_error`` is what its first attempt (in a batch) raised."""
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
            self._dead_letter(message, exc)
            return self._commit(message)
        return self._handle(message, event, None)

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
                where = f"event {shown(event.id)} ({shown(event.event_type)}) at {_at(message)}"
                if what == "crash":
                    log.error(
                        "handler failed on %s: %s; rolled back, offset not committed", where, _name(exc)
                    )
                    raise
                if what == "retry" and attempt < self.retry.attempts:
                    delay = self.retry.delay(attempt)
                    log.warning("%s: %s, attempt %d; retrying in %.2f s", where, _name(exc), attempt, delay)
                    self.counts["retried"] += 1
                    attempt += 1
                    if self._stop.wait(delay):
                        log.info("stopping during a retry of %s: left uncommitted, to be read again", where)
                        return None
                    continue
                final: BaseException = exc
                if what == "retry":
                    final = RetriesExhaustedError(f"{where}: still failing after {attempt} attempts: {exc}")
                    if self.on_retries_exhausted == "stop":
                        log.error("%s: %s; stopping, offset not committed", where, _name(final))
                        raise final from exc
                self._dead_letter(message, final, where)
                return self._commit(message)
        self._count(event, new)
        return self._commit(message)

    def _deserialize(self, message: Any) -> Event | None:
        """The event; a schema registry that does not answer is waited for within the retry policy (the
        record is not to blame), then RegistryUnavailableError stops the consumer, offset not committed."""
        attempt = 1
        while True:
            try:
                return self.deserializer(message)
            except RegistryUnavailableError as exc:
                if attempt >= self.retry.attempts:
                    raise
                delay = self.retry.delay(attempt)
                log.warning("%s at %s; attempt %d, retrying in %.2f s", exc, _at(message), attempt, delay)
                attempt += 1
                if self._stop.wait(delay):
                    return None

    def _apply(self, event: Event) -> bool:
        """One transaction: the guard row, and the handler when the row is new. True when it was new."""
        assert self._conn is not None, "run() opens the connection"
        with self._conn.transaction():
            new = mark_processed(self._conn, self.table, event.id, self.name)
            if new:
                self.handler(self._conn, event)
        return new

    def _dead_letter(self, message: Any, exc: BaseException, where: str | None = None) -> None:
        where = where or f"record at {_at(message)}"
        log.warning("%s goes to the dead-letter topic %s: %s", where, self.dlq_topic, _name(exc))
        _, timestamp = message.timestamp()
        error: KafkaError | str | None = None
        # A dead letter too large for the producer or the topic would stop the consumer on a record that
        # failed for another reason: it is sent again smaller (cdc.consumer.failures.dead_letter_records).
        for key, value, headers in dead_letter_records(message, exc, self.name):
            if error is not None:
                log.warning(
                    "%s is too large for %s; sending it smaller (%s)",
                    where,
                    self.dlq_topic,
                    dict(headers)["reduced"].decode(),  # what is left out
                )
            error = self._send_dead_letter(key, value, headers, max(timestamp, 0))
            if error is None:
                self.counts["dead_lettered"] += 1
                return
            if not (isinstance(error, KafkaError) and error.code() in _TOO_LARGE):
                break
        # Not dead-lettered, so not acknowledged either: a restart reads the record again.
        fix = (
            ": even reduced to its error headers it does not fit; raise the topic's max.message.bytes"
            if isinstance(error, KafkaError) and error.code() in _TOO_LARGE
            else ""
        )
        raise ConsumerError(f"cannot write {where} to {self.dlq_topic}: {error}{fix}")

    def _send_dead_letter(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], timestamp: int
    ) -> KafkaError | str | None:
        """None once delivered, else what went wrong (a too-large record fails here or in its report)."""
        reports: list[KafkaError | None] = []
        try:
            self._producer.produce(
                self.dlq_topic,
                key=key,
                value=value,
                headers=headers,
                timestamp=timestamp,
                on_delivery=lambda err, _msg: reports.append(err),
            )
        except KafkaException as exc:
            return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
        self._producer.flush(self._producer_conf["message.timeout.ms"] / 1000 + 5)
        return reports[0] if reports else "no ack"


def _at(message: Any) -> str:
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"


def _name(exc: BaseException) -> str:
    return (
        f"{type(exc).__name__} ({error_reason(exc)})"
        if classify(exc) == "dead_letter"
        else type(exc).__name__
    )


def _parts(partitions: list[Any]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
