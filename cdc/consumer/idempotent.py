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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import psycopg

from cdc.avro.deserialize import Event, EventDeserializer, KafkaMessage
from cdc.config import PARTITIONERS, TableRef
from cdc.consumer.failures import (
    RetryPolicy,
)
from cdc.consumer.processed import DEFAULT_TABLE
from cdc.consumer.records import BatchHandler, Handler
from cdc.consumer.session import Session, consumer_config
from cdc.errors import (
    ConfigError,
)


class IdempotentConsumer(Session):
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
        self._per_record = 0.0  # seconds per record, a moving average: sizes the next batch
        self._pipelined = pipeline  # a batch's handlers in psycopg's pipeline mode (cdc.consumer.batches)
        self._early_guard = True  # guard rows sent before the batch is decoded (cdc.consumer.batches)
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
        if partitioner not in PARTITIONERS:
            raise ConfigError(
                f"partitioner must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}",
                key="partitioner",
            )
        # The pipeline's partitioner (Java's by default): a dead letter lands where its aggregate lives.
        self._producer_conf.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": 30_000,
                "partitioner": partitioner,
            }
        )
        self._stop = threading.Event()
        self._watchdog: threading.Timer | None = None
        self._hard_deadline = False
        self._pending: dict[tuple[str, int], int] = {}  # offsets processed but not yet committed
        self._consumer: Any = None
        self._producer: Any = None
        self._conn: psycopg.Connection[Any] | None = None
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}
