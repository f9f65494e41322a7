"""The consumer's session with its Kafka group: the librdkafka consumer, what it asks it for, and the offsets.

:class:`Session` owns the Kafka consumer (made by :meth:`Session.open`, closed by :meth:`Session.close`) and
the offsets of finished records that the broker has not confirmed yet. It knows nothing of the service's
database, its handlers or its dead-letter topic: the parts that process records call :meth:`Session.done`
with the records whose effects the database has committed, and it commits past them.

Offsets are committed without waiting for the broker: the effects are already in the database, so an offset
only saves a redelivery (which the guard rows acknowledge as a duplicate), and waiting cost each batch a round
trip (about a tenth of its time). An offset stays pending until the broker confirms it (librdkafka's
``on_commit``, served inside ``consume()``); a failed commit stays pending and the next one carries it.

Rebalance callbacks run inside ``consume()``, between batches, so a revoked partition's records are finished
and committed before it goes: what is pending for it is committed synchronously then (and by the close,
which revokes everything). A lost partition already belongs to another member: its pending offsets are
dropped, the guard rows cover the redelivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc.errors import ConfigError, ConsumerError

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


class Session:
    """The group membership of one consumer: records in, offsets out.

    ``kafka`` makes the librdkafka consumer from its settings (``confluent_kafka.Consumer``; a fake in the
    unit tests)."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        topics: Sequence[str],
        *,
        name: str,
        poll_timeout: float,
        kafka: Callable[[dict[str, Any]], Any] = Consumer,
    ) -> None:
        self._conf = dict(conf)
        self._topics = list(topics)
        self._name = name
        self._poll_timeout = poll_timeout
        self._make_consumer = kafka
        self._consumer: Any = None
        self._pending: dict[tuple[str, int], int] = {}  # (topic, partition): the offset to commit

    @property
    def pending(self) -> dict[tuple[str, int], int]:
        """The offsets committed and not yet confirmed by the broker, by ``(topic, partition)`` (a copy)."""
        return dict(self._pending)

    def open(self) -> None:
        """Make the Kafka consumer and join the group (the assignment comes with the first ``poll``)."""
        self._consumer = self._make_consumer({**self._conf, "on_commit": self._on_committed})
        self._consumer.subscribe(
            self._topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info("consumer %s subscribed to %s (group %s)", self._name, self._topics, self._conf["group.id"])

    def close(self) -> None:
        """Leave the group: librdkafka revokes everything first, which commits what is pending."""
        if self._consumer is not None:
            self._consumer.close()

    def poll(self, size: int) -> list[Any]:
        """Up to ``size`` records without waiting for that many: what is queued now, or else the first to
        arrive within ``poll_timeout`` and what came with it. ``consume(size, timeout)`` waits for ``size``
        records or the timeout, which held every record of a consumer that keeps up for up to
        ``poll_timeout`` (its batches sized for a backlog). A fatal Kafka error raises ConsumerError; any
        other is logged and left to librdkafka, which recovers from it."""
        consume = self._consumer.consume
        messages: list[Any] = consume(size, 0)
        if not messages:
            messages = consume(1, self._poll_timeout)
            if messages and size > 1:
                messages += consume(size - 1, 0)
        records = []
        for message in messages:
            if (err := message.error()) is None:
                records.append(message)
            elif err.fatal():
                raise ConsumerError(f"Kafka consumer failed: {err.str()}")
            else:
                log.warning("Kafka: %s", err.str())
        return records

    def done(self, *messages: Any) -> None:
        """Commit past ``messages``, whose effects the database has committed (a batch may span partitions:
        each one's offset is noted, in order), asynchronously: pending until the broker confirms it."""
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
        """What the broker confirmed is no longer pending (librdkafka's ``on_commit``; and the result of a
        synchronous commit). A failed commit stays pending: the next one carries it."""
        if error is not None:
            log.warning("offset commit failed (%s): retried with the next commit", error.str())
            return
        for tp in partitions:
            if tp.error is None and self._pending.get((tp.topic, tp.partition)) == tp.offset:
                del self._pending[(tp.topic, tp.partition)]

    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        log.info("consumer %s assigned %s", self._name, _parts(partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        # Called inside consume(), so the batch is finished: commit what it left before the move.
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._commit_pending(keys)
        for key in keys:
            self._pending.pop(key, None)
        log.info("consumer %s revoked %s", self._name, _parts(partitions))

    def _on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        # The partitions already belong to another member: a commit would be refused; the guard covers it.
        for tp in partitions:
            self._pending.pop((tp.topic, tp.partition), None)
        log.warning("consumer %s lost %s", self._name, _parts(partitions))


def _parts(partitions: list[Any]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
