"""The consumer's session: its connections, the consume loop, offset commits, rebalances and shutdown.

Rebalance callbacks run inside ``poll()``, between records, so a revoked partition's current record is
finished and committed before the partition goes; an offset whose commit failed is retried on revocation.
SIGTERM/SIGINT stop after the current record, or exit 1 past ``shutdown_timeout``.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer, KafkaException, Producer

from cdc.consumer.batches import Batches
from cdc.consumer.records import _parts
from cdc.errors import (
    ConfigError,
    ConsumerError,
    TopicMissingError,
    first_line,
)
from cdc.logs import enable_crash_dumps

log = logging.getLogger("cdc.consumer")

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
        # Memory. A consumer behind its topic keeps librdkafka's queue of fetched records full, and a queued
        # record costs about 500 B beyond the key and value that queued.max.messages.kbytes counts (its
        # fetch buffer stays allocated, and librdkafka's message): with the default 100,000 records
        # (queued.min.messages, which binds before the kbytes of small records) and 1 MiB fetches per
        # partition, the consumer sat at 188 MB behind an lz4 topic of 6 partitions, against 64 MB keeping
        # up. 10,000 records (0.3 s of work at 30,000 events/s) and 256 KiB fetches hold it at 75 MB, at the
        # same rate (measured on 2-3M records behind, back to back). The kbytes bound stays for large
        # records; a record larger than a fetch still comes whole (Kafka returns a partition's first batch),
        # and a full queue is fetched again after 50 ms rather than librdkafka's 1 s.
        "queued.min.messages": 10_000,
        "max.partition.fetch.bytes": 256 * 1024,
        "queued.max.messages.kbytes": 16 * 1024,
        "fetch.queue.backoff.ms": 50,
    }
    conf.update(extra)
    conf.update(FIXED_CONSUMER_CONFIG)
    return conf


class Session(Batches):
    """Connections, the consume loop, commits, rebalances, stopping."""

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
        if not faulthandler.is_enabled():
            enable_crash_dumps()  # a native crash leaves the Python stack where the service logs
        try:
            self._open()
            while not self._stop.is_set():
                records = []
                for message in self._poll(self._next_batch_size()):
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

    def _poll(self, size: int) -> list[Any]:
        """Up to ``size`` records without waiting for that many: what is queued now, or else the first to
        arrive within ``poll_timeout`` and what came with it. ``consume(size, timeout)`` waits for ``size``
        records or the timeout, which held every record of a consumer that keeps up for up to
        ``poll_timeout`` (its batches sized for a backlog)."""
        messages: list[Any] = self._consumer.consume(size, 0)
        if not messages:
            messages = self._consumer.consume(1, self.poll_timeout)
            if messages and size > 1:
                messages += self._consumer.consume(size - 1, 0)
        return messages

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
        self._consumer = Consumer({**self._conf, "on_commit": self._on_committed})
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
