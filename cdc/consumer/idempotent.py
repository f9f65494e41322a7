"""For the services downstream: read the pipeline's events and give each exactly one business effect.

Kafka delivers at least once (a pipeline restart republishes, a rebalance or a crash re-reads what was not
committed). :class:`IdempotentConsumer` turns that into one effect per event, using the service's own
PostgreSQL: for each record it

1. decodes it (:class:`EventDeserializer`; an undecodable record is a permanent error, see below);
2. in one transaction inserts ``(event_id, consumer)`` into ``processed_events`` (``ON CONFLICT DO NOTHING``)
   and, only when that row is new, calls ``handler(conn, event)``: the effect and the guard row commit
   together or not at all; a duplicate commits nothing new and skips the handler;
3. commits the Kafka offset past the record, only after the database commit; without waiting for the
   broker's answer (an offset stays pending until it is confirmed, and a revocation or the close commits
   what is pending synchronously).

A crash anywhere before step 2's commit leaves neither the effect nor the guard row, and the record is read
again; a crash between 2 and 3 leaves both, and the redelivered record is acknowledged as a duplicate.

Records are taken in batches: one transaction holds the guard rows (one statement) and the effects of
several records, then one offset commit covers them, because a commit per record (an fsync each) caps a
service at a few hundred events/s. A batch is sized from the measured time per record to take about
``BATCH_SECONDS``, so that rebalances and ``max.poll.interval.ms`` never wait long for it, and holds at most
``batch_size`` records (1000: past a few hundred, the commits' share of a record's cost is small). The
handlers of a batch run in psycopg's pipeline mode (``pipeline=False`` turns it off), which sends their
statements without a round trip each (:mod:`cdc.consumer.batches` says how a failure is still blamed on the
right record). A handler that raises rolls its batch back; the records before it are done again without it
and committed, and it then takes the per-record path below with the error it raised (its first attempt).

    def create_invoice(conn, event):  # inside the transaction: use conn, never commit
        conn.execute("INSERT INTO invoices (order_id) VALUES (%s)", (event.payload["order_id"],))

    IdempotentConsumer(name="invoice-service", topics=["outbox.event.order"], handler=create_invoice,
                       database_url=dsn, bootstrap_servers="kafka:9092",
                       deserializer=EventDeserializer("schemas", reader_versions={"OrderPlaced": 1})).serve()

A handler that can write many events at once takes ``batch_handler=`` instead of ``handler=``:
``batch_handler(conn, events)`` gets the new events of a batch (each id once, in the order read) in the
same transaction as their guard rows, to write them with one ``executemany`` or ``COPY``. When it raises,
which event is to blame is not known: the batch is rolled back and done again in halves until the failing
event is alone (the halves that succeed commit), and that event then takes the per-record path below as a
batch of one, with the error it raised. So a batch handler may be called again with part of a batch it
raised for, and an error that does not come back (a crash-class bug that only happens once) is not raised.

``cdc consumer setup`` creates ``processed_events``, ``cdc consumer prune`` trims it
(:mod:`cdc.consumer.processed`).

What a handler's exception does is decided in :mod:`cdc.consumer.failures`: a :class:`RetryableError` is
retried with backoff (bounded; then the consumer stops), a :class:`PermanentError` or an undecodable record
goes to the service's dead-letter topic (reduced when it is too large for it) and the partition moves on,
anything else rolls back and leaves :meth:`IdempotentConsumer.run` without committing the offset, so a restart
reads the record again.

Rebalances: callbacks run inside ``poll()``, i.e. between records, so a revoked partition's current record is
finished and committed before the partition goes; an offset whose commit failed is retried on revocation.
:meth:`IdempotentConsumer.serve` stops on SIGTERM/SIGINT after the current record, commits, leaves the group
and returns, or exits 1 when that takes longer than ``shutdown_timeout`` (uncommitted work is re-read).
Payloads are never logged; dead-letter headers carry the handler's message, so keep values out of it.

The consumer is made of parts, each with its own state, put together in one place
(:meth:`IdempotentConsumer.run`, once the connections are open; docs/consumers.md draws them):
:class:`~cdc.consumer.session.Session` (the Kafka consumer, rebalances and the offsets),
:class:`~cdc.consumer.batches.Batches` (the batch path), :class:`~cdc.consumer.records.Records` (the
per-record path: retries and dead letters) and :class:`~cdc.consumer.dead_letters.DeadLetters` (the
dead-letter producer). This class owns the settings, the stop, and the counts the parts add to.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import psycopg

from cdc.avro.deserialize import Event, EventDeserializer, KafkaMessage
from cdc.config import TableRef
from cdc.consumer.batches import Batches
from cdc.consumer.dead_letters import DeadLetters, producer_config
from cdc.consumer.failures import RetryPolicy
from cdc.consumer.processed import DEFAULT_TABLE
from cdc.consumer.records import BatchHandler, Handler, Records
from cdc.consumer.session import Session, consumer_config
from cdc.consumer.spans import handler_spans
from cdc.errors import ConfigError, ConsumerError, first_line
from cdc.logs import enable_crash_dumps

log = logging.getLogger("cdc.consumer")


class IdempotentConsumer:
    """Consume ``topics`` with group ``group_id`` (default ``name``) and call ``handler`` once per event.

    ``name`` is the ``consumer`` column of ``processed_events``: keep it stable across deployments of the
    same service, and distinct between services whose effects differ."""

    def __init__(
        self,
        *,
        name: str,
        topics: Sequence[str],
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
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
        batch_size: int = 1000,
        pipeline: bool = True,
        partitioner: str = "murmur2_random",
    ) -> None:
        if not name or not topics:
            raise ConfigError("an IdempotentConsumer needs a name and at least one topic", key="consumer")
        if (handler is None) == (batch_handler is None):
            raise ConfigError(
                "an IdempotentConsumer takes a handler (one event per call) or a batch_handler (the new "
                "events of a batch per call): give exactly one",
                key="handler",
            )
        self.name, self.topics = name, list(topics)
        self.batch_handler = batch_handler
        if handler is None:
            assert batch_handler is not None

            def handler(conn: psycopg.Connection[Any], event: Event) -> None:
                batch_handler(conn, [event])  # the per-record path: a batch of one

        self.handler = handler
        self.deserializer = deserializer or EventDeserializer()
        self.dlq_topic = dlq_topic or f"{name}.dlq"
        self.retry = retry or RetryPolicy()
        self.on_retries_exhausted = on_retries_exhausted
        self.table, self.shutdown_timeout, self.poll_timeout = processed_table, shutdown_timeout, poll_timeout
        if batch_size < 1:
            raise ConfigError("batch_size must be at least 1", key="batch_size")
        self.batch_size = batch_size
        self._pipeline = pipeline  # a batch's handlers in psycopg's pipeline mode (cdc.consumer.batches)
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
        self._producer_conf = producer_config(self._conf, partitioner)
        self._stop = threading.Event()  # handed to the parts: the loop, a batch and a retry's sleep end on it
        self._watchdog: threading.Timer | None = None
        self._hard_deadline = False
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}

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
        """Consume until :meth:`request_stop`; a crash propagates after rolling back (module docstring).

        Opens the service's database, the dead-letter producer and the Kafka consumer, in this order, puts
        the parts together around them (:meth:`_assemble`), and closes them in reverse order: leaving the
        group commits what is pending first."""
        if not faulthandler.is_enabled():
            enable_crash_dumps()  # a native crash leaves the Python stack where the service logs
        session = Session(self._conf, self.topics, name=self.name, poll_timeout=self.poll_timeout)
        letters = DeadLetters(self._producer_conf, self.dlq_topic, consumer=self.name, counts=self.counts)
        conn: psycopg.Connection[Any] | None = None
        try:
            try:
                conn = psycopg.connect(self._database_url, autocommit=True, connect_timeout=10)
            except psycopg.OperationalError as exc:
                raise ConsumerError(f"cannot connect to the service database: {first_line(exc)}") from exc
            letters.open()
            session.open()
            batches = self._assemble(conn, session, letters)
            while not self._stop.is_set():
                batches.process(session.poll(batches.next_size()))
        finally:
            try:
                session.close()
            finally:
                letters.close()
                if conn is not None:
                    conn.close()
        log.info("consumer %s stopped: %s", self.name, self.counts)

    def _assemble(self, conn: psycopg.Connection[Any], session: Session, letters: DeadLetters) -> Batches:
        """The parts that process records, each handed what it needs: the one place where the service's
        handler and batch handler are given to the consumer's code (to wrap them, a tracing span around
        each call say, wrap them here)."""
        spans = handler_spans()  # OpenTelemetry's CONSUMER spans around the handlers, when it is installed
        records = Records(
            conn,
            handler=self.handler,
            deserializer=self.deserializer,
            table=self.table,
            name=self.name,
            retry=self.retry,
            on_retries_exhausted=self.on_retries_exhausted,
            dead_letter=letters.send,
            done=session.done,
            stop=self._stop,
            counts=self.counts,
            spans=spans,
        )
        return Batches(
            conn,
            handler=self.handler,
            batch_handler=self.batch_handler,
            deserializer=self.deserializer,
            table=self.table,
            name=self.name,
            batch_size=self.batch_size,
            pipeline=self._pipeline,
            one_by_one=records.process,
            counted=records.counted,
            done=session.done,
            stop=self._stop,
            spans=spans,
        )
