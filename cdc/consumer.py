"""For the services downstream: read the pipeline's events and give each exactly one business effect.

Kafka delivers at least once (a pipeline restart republishes, a rebalance or a crash re-reads what was not
committed). :class:`IdempotentConsumer` turns that into one effect per event, using the service's own
PostgreSQL: for each record it

1. decodes it (:class:`EventDeserializer`; an undecodable record is a permanent error, see below);
2. in one transaction inserts ``(event_id, consumer)`` into ``processed_events`` (``ON CONFLICT DO NOTHING``)
   and, only when that row is new, calls ``handler(conn, event)``: the effect and the guard row commit
   together or not at all; a duplicate commits nothing new and skips the handler;
3. commits the Kafka offset past the record, synchronously, only after the database commit.

A crash anywhere before step 2's commit leaves neither the effect nor the guard row, and the record is read
again; a crash between 2 and 3 leaves both, and the redelivered record is acknowledged as a duplicate.

Records are taken in batches: one transaction holds the guard rows (one statement) and the effects of
several records, then one offset commit covers them, because a commit per record (an fsync each) caps a
service at a few hundred events/s. A batch is sized from the measured time per record to take about
``BATCH_SECONDS``, so that rebalances and ``max.poll.interval.ms`` never wait long for it. A handler that
raises rolls its batch back; the records before it are done again without it and committed, and it then
takes the per-record path below with the error it raised (its first attempt).

    def create_invoice(conn, event):  # inside the transaction: use conn, never commit
        conn.execute("INSERT INTO invoices (order_id) VALUES (%s)", (event.payload["order_id"],))

    IdempotentConsumer(name="invoice-service", topics=["outbox.event.order"], handler=create_invoice,
                       database_url=dsn, bootstrap_servers="kafka:9092",
                       deserializer=EventDeserializer("schemas", reader_versions={"OrderPlaced": 1})).serve()

``cdc consumer setup`` creates ``processed_events``, ``cdc consumer prune`` trims it (:mod:`cdc.processed`).

What a handler's exception does is decided in :mod:`cdc.failures`: a :class:`RetryableError` is retried
with backoff (bounded; then the consumer stops), a :class:`PermanentError` or an undecodable record goes to
the service's dead-letter topic (reduced when it is too large for it) and the partition moves on, anything
else rolls back and leaves :meth:`IdempotentConsumer.run` without committing the offset, so a restart reads
the record again.

Rebalances: callbacks run inside ``poll()``, i.e. between records, so a revoked partition's current record is
finished and committed before the partition goes; an offset whose commit failed is retried on revocation.
:meth:`IdempotentConsumer.serve` stops on SIGTERM/SIGINT after the current record, commits, leaves the group
and returns, or exits 1 when that takes longer than ``shutdown_timeout`` (uncommitted work is re-read).
Payloads are never logged; dead-letter headers carry the handler's message, so keep values out of it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from cdc.config import TableRef
from cdc.deserialize import Event, EventDeserializer, KafkaMessage
from cdc.errors import (
    ConfigError,
    ConsumerError,
    DeserializationError,
    PermanentError,
    RegistryUnavailableError,
    RetriesExhaustedError,
    RetryableError,
    TopicMissingError,
    first_line,
)
from cdc.failures import RetryPolicy, classify, dead_letter_headers, dead_letter_records, error_reason
from cdc.processed import DEFAULT_TABLE, mark_many, mark_processed

__all__ = [
    "Event",
    "EventDeserializer",
    "Handler",
    "IdempotentConsumer",
    "KafkaMessage",
    "PermanentError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RetryableError",
    "classify",
    "consumer_config",
    "dead_letter_headers",
]

log = logging.getLogger("cdc.consumer")

BATCH_SECONDS: Final = 0.25  # the time one batch (one transaction, one offset commit) aims to take
# A record the producer (message.max.bytes) or the dead-letter topic (max.message.bytes) refuses for its size.
_TOO_LARGE: Final = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)


class _BatchEnded(Exception):
    """Internal: the handler raised for the index-th event of a batch."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index, self.error = index, error


Handler = Callable[[psycopg.Connection[Any], Event], None]

# The guarantees rest on these: offsets move only when this module commits them, and records of aborted
# Kafka transactions are never handed to a handler.
FIXED_CONSUMER_CONFIG: Final[dict[str, Any]] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
}


def consumer_config(
    bootstrap_servers: str, group_id: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """librdkafka settings: our defaults, then ``extra``; the guarantees' settings may not be overridden."""
    extra = dict(extra or {})
    for key, value in FIXED_CONSUMER_CONFIG.items():
        if key in extra and str(extra[key]).lower() != str(value).lower():
            raise ConfigError(
                f"kafka setting {key!r} must stay {value!r} for the consumer's guarantees", key=key
            )
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "auto.offset.reset": "earliest",  # a new group must not skip what was published before it joined
        "partition.assignment.strategy": "cooperative-sticky",  # a rebalance stops only the moved partitions
        "client.id": f"outbox-cdc-consumer-{group_id}",
    }
    conf.update(extra)
    conf.update(FIXED_CONSUMER_CONFIG)
    return conf


class IdempotentConsumer:
    """Consume ``topics`` with group ``group_id`` (default ``name``) and call ``handler`` once per event.

    ``name`` is the ``consumer`` column of ``processed_events``: keep it stable across deployments of the
    same service, and distinct between services whose effects differ."""

    def __init__(
        self,
        *,
        name: str,
        topics: Sequence[str],
        handler: Handler,
        database_url: str,
        bootstrap_servers: str,
        deserializer: Callable[[KafkaMessage], Event] | None = None,
        group_id: str | None = None,
        dlq_topic: str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        on_retries_exhausted: Literal["stop", "dead_letter"] = "stop",
        processed_table: TableRef = DEFAULT_TABLE,
        shutdown_timeout: float = 30.0,
        poll_timeout: float = 0.5,
        batch_size: int = 100,
    ) -> None:
        if not name or not topics:
            raise ConfigError("an IdempotentConsumer needs a name and at least one topic", key="consumer")
        self.name, self.topics, self.handler = name, list(topics), handler
        self.deserializer = deserializer or EventDeserializer()
        self.dlq_topic = dlq_topic or f"{name}.dlq"
        self.retry = retry or RetryPolicy()
        self.on_retries_exhausted = on_retries_exhausted
        self.table, self.shutdown_timeout, self.poll_timeout = processed_table, shutdown_timeout, poll_timeout
        if batch_size < 1:
            raise ConfigError("batch_size must be at least 1", key="batch_size")
        self.batch_size = batch_size
        self._per_record = 0.0  # seconds per record, a moving average: sizes the next batch
        self._database_url = database_url
        self._conf = consumer_config(bootstrap_servers, group_id or name, kafka_config)
        poll_interval = float(self._conf.get("max.poll.interval.ms", 300_000)) / 1000
        if self.retry.worst_case() >= poll_interval / 2:
            # Retries sleep without polling: past max.poll.interval.ms the group evicts this member mid-retry.
            raise ConfigError(
                f"the retry policy may sleep {self.retry.worst_case():g} s per record; keep it under half of "
                f"max.poll.interval.ms ({poll_interval:g} s)",
                key="retry",
            )
        # The dead-letter producer needs only the connection and security settings of the consumer's config.
        self._producer_conf = {
            k: v for k, v in self._conf.items() if k.startswith(("bootstrap.", "security.", "sasl.", "ssl."))
        }
        self._producer_conf.update({"enable.idempotence": True, "acks": "all", "message.timeout.ms": 30_000})
        self._stop = threading.Event()
        self._watchdog: threading.Timer | None = None
        self._hard_deadline = False
        self._pending: dict[tuple[str, int], int] = {}  # offsets processed but not yet committed
        self._consumer: Any = None
        self._producer: Any = None
        self._conn: psycopg.Connection[Any] | None = None
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}

    # -- lifecycle --------------------------------------------------------------------------------------

    def serve(self) -> None:
        """:meth:`run` with SIGTERM/SIGINT handlers; the process exits 1 if stopping overruns the bound."""
        self._hard_deadline = True

        def stop(signum: int, _frame: object) -> None:
            log.info("received %s: stopping after the current record", signal.Signals(signum).name)
            self.request_stop()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._watchdog is not None:
                self._watchdog.cancel()

    def request_stop(self) -> None:
        """Stop after the current record (safe from a signal handler or another thread)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._hard_deadline:
            self._watchdog = threading.Timer(self.shutdown_timeout, self._overdue)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _overdue(self) -> None:
        # A handler that hangs must not keep the process (and its partitions) forever; nothing uncommitted is
        # lost: the server rolls back the open transaction and the group re-reads the record.
        log.error("consumer %s did not stop within %g s: exiting 1", self.name, self.shutdown_timeout)
        sys.stderr.flush()
        os._exit(1)

    def run(self) -> None:
        """Consume until :meth:`request_stop`; a crash propagates after rolling back (module docstring)."""
        try:
            self._open()
            while not self._stop.is_set():
                records = []
                for message in self._consumer.consume(self._next_batch_size(), self.poll_timeout):
                    if (err := message.error()) is None:
                        records.append(message)
                    elif err.fatal():
                        raise ConsumerError(f"Kafka consumer failed: {err.str()}")
                    else:
                        log.warning("Kafka: %s", err.str())
                self._process_batch(records)
        finally:
            self._close()
        log.info("consumer %s stopped: %s", self.name, self.counts)

    def _open(self) -> None:
        try:
            self._conn = psycopg.connect(self._database_url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise ConsumerError(f"cannot connect to the service database: {first_line(exc)}") from exc
        try:
            self._producer = Producer(self._producer_conf)
            known = self._producer.list_topics(timeout=10).topics
        except KafkaException as exc:
            raise ConsumerError(f"Kafka does not answer: {exc.args[0]}") from exc
        if self.dlq_topic not in known:
            raise TopicMissingError(
                f"the dead-letter topic {self.dlq_topic!r} does not exist: create it first"
            )
        self._consumer = Consumer(self._conf)
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info("consumer %s subscribed to %s (group %s)", self.name, self.topics, self._conf["group.id"])

    def _close(self) -> None:
        try:
            if self._consumer is not None:
                self._consumer.close()  # revokes everything (committing pending offsets) and leaves the group
        finally:
            if self._producer is not None:
                self._producer.flush(5)
            if self._conn is not None:
                self._conn.close()

    # -- one record -------------------------------------------------------------------------------------

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
        assert self._conn is not None, "run() opens the connection"
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
        while events:
            try:
                with self._conn.transaction():
                    new = mark_many(self._conn, self.table, [e.id for e in events], self.name)
                    handled: set[str] = set()
                    for index, event in enumerate(events):
                        if event.id in new and event.id not in handled:
                            try:
                                self.handler(self._conn, event)
                            except Exception as exc:
                                raise _BatchEnded(index, exc) from exc
                            handled.add(event.id)
            except _BatchEnded as ended:
                failed, events = (events[ended.index], ended.error), events[: ended.index]
                continue
            except Exception as exc:  # the guard statement itself (a deadlock, a lost connection)
                return 0, (events[0], exc)
            counted: set[str] = set()
            for event in events:  # an id twice in one batch: the second is a duplicate
                self._count(event, event.id in handled and event.id not in counted)
                counted.add(event.id)
            return len(events), failed
        return 0, failed

    def _count(self, event: Event, new: bool) -> None:
        self.counts["processed" if new else "duplicate"] += 1
        if not new:
            log.info("event %s was processed before: acknowledged without calling the handler", event.id)

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
                where = f"event {event.id} ({event.event_type}) at {_at(message)}"
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
        # failed for another reason: it is sent again smaller (cdc.failures.dead_letter_records).
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

    # -- offsets ----------------------------------------------------------------------------------------

    def _commit(self, *messages: Any) -> None:
        """Commit past ``messages`` (a batch may span partitions: each one's offset is noted, in order)."""
        for message in messages:
            self._pending[(message.topic(), message.partition())] = message.offset() + 1
        self._commit_pending(list(self._pending))

    def _commit_pending(self, keys: list[tuple[str, int]]) -> None:
        offsets = [TopicPartition(t, p, self._pending[(t, p)]) for t, p in keys if (t, p) in self._pending]
        if not offsets:
            return
        try:
            done = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Safe to leave: the database already holds the guard row, so a redelivery is a duplicate.
            log.warning("offset commit failed (%s): retried with the next commit", exc.args[0])
            return
        for tp in done or offsets:
            if tp.error is None and self._pending.get((tp.topic, tp.partition)) == tp.offset:
                del self._pending[(tp.topic, tp.partition)]

    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        log.info("consumer %s assigned %s", self.name, _parts(partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        # Called inside poll(), so the current record is finished: commit what it left before the move.
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._commit_pending(keys)
        for key in keys:
            self._pending.pop(key, None)
        log.info("consumer %s revoked %s", self.name, _parts(partitions))

    def _on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        # The partitions already belong to another member: a commit would be refused; the guard covers it.
        for tp in partitions:
            self._pending.pop((tp.topic, tp.partition), None)
        log.warning("consumer %s lost %s", self.name, _parts(partitions))


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
