"""The service's dead-letter topic: the producer that writes to it, and dead letters that always fit.

:class:`DeadLetters` owns the dead-letter producer: :meth:`DeadLetters.open` makes it and refuses a topic
that does not exist (a service's user often may not create topics: the operator makes it), :meth:`send`
writes one record's dead letter and waits for the broker's acknowledgement, :meth:`close` flushes. Which
record goes there, and why, is decided by the record path (:mod:`cdc.consumer.records`) with the rules of
:mod:`cdc.consumer.failures`, which also builds the dead letter and its smaller versions.

A dead letter too large for the producer (``message.max.bytes``) or for the topic (``max.message.bytes``)
would stop the consumer on a record that failed for another reason: it is sent again smaller. One that does
not fit even reduced to its error headers, or that Kafka refuses for another reason, raises ConsumerError:
the record is then neither dead-lettered nor acknowledged, and a restart reads it again.

The producer connects as the consumer does (its bootstrap, security, SASL and SSL settings), idempotent with
``acks=all``, and partitions as the pipeline does (Java's murmur2 by default), so that a dead letter lands
on the partition where its aggregate lives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from cdc.avro.deserialize import KafkaMessage
from cdc.config import PARTITIONERS
from cdc.consumer.failures import dead_letter_records, error_name, record_at
from cdc.errors import ConfigError, ConsumerError, TopicMissingError

log = logging.getLogger("cdc.consumer")

# A record the producer (message.max.bytes) or the dead-letter topic (max.message.bytes) refuses for its size.
_TOO_LARGE: Final = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)
_DELIVERY_TIMEOUT_MS: Final = 30_000  # message.timeout.ms: a dead letter not acknowledged by then failed


def producer_config(consumer_conf: Mapping[str, Any], partitioner: str) -> dict[str, Any]:
    """The dead-letter producer's settings: the connection and security settings of the consumer's, and
    the pipeline's ``partitioner``."""
    if partitioner not in PARTITIONERS:
        raise ConfigError(
            f"partitioner must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}",
            key="partitioner",
        )
    connection = ("bootstrap.", "security.", "sasl.", "ssl.")
    conf = {k: v for k, v in consumer_conf.items() if k.startswith(connection)}
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": _DELIVERY_TIMEOUT_MS,
            "partitioner": partitioner,
        }
    )
    return conf


class DeadLetters:
    """Writes dead letters to ``topic`` for the consumer ``consumer`` and counts each delivered one in
    ``counts["dead_lettered"]``. ``producer`` makes the Kafka producer from its settings
    (``confluent_kafka.Producer``; a fake in the unit tests)."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        topic: str,
        *,
        consumer: str,
        counts: dict[str, int],
        producer: Callable[[dict[str, Any]], Any] = Producer,
    ) -> None:
        self._conf = dict(conf)
        self._topic = topic
        self._consumer = consumer
        self._counts = counts
        self._make_producer = producer
        self._producer: Any = None
        # A delivery report comes within message.timeout.ms; the flush waits a little longer for it.
        self._flush_timeout = float(self._conf.get("message.timeout.ms", _DELIVERY_TIMEOUT_MS)) / 1000 + 5

    def open(self) -> None:
        """Make the producer; TopicMissingError when the dead-letter topic does not exist."""
        try:
            self._producer = self._make_producer(self._conf)
            known = self._producer.list_topics(timeout=10).topics
        except KafkaException as exc:
            raise ConsumerError(f"Kafka does not answer: {exc.args[0]}") from exc
        if self._topic not in known:
            raise TopicMissingError(f"the dead-letter topic {self._topic!r} does not exist: create it first")

    def close(self) -> None:
        """Flush (bounded), then let the producer go: its destroy joins its threads now, not at the
        service's exit (docs/operations.md, "A crash")."""
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None

    def send(self, message: KafkaMessage, exc: BaseException, where: str | None = None) -> None:
        """Write the dead letter of ``message``, which failed with ``exc`` (``where`` names it in the logs),
        and return once the broker has it; ConsumerError when it cannot be written (module docstring)."""
        where = where or f"record at {record_at(message)}"
        log.warning("%s goes to the dead-letter topic %s: %s", where, self._topic, error_name(exc))
        _, timestamp = message.timestamp()
        error: KafkaError | str | None = None
        for key, value, headers in dead_letter_records(message, exc, self._consumer):
            if error is not None:
                log.warning(
                    "%s is too large for %s; sending it smaller (%s)",
                    where,
                    self._topic,
                    dict(headers)["reduced"].decode(),  # what is left out
                )
            error = self._deliver(key, value, headers, max(timestamp, 0))
            if error is None:
                self._counts["dead_lettered"] += 1
                return
            if not (isinstance(error, KafkaError) and error.code() in _TOO_LARGE):
                break
        # Not dead-lettered, so not acknowledged either: a restart reads the record again.
        fix = (
            ": even reduced to its error headers it does not fit; raise the topic's max.message.bytes"
            if isinstance(error, KafkaError) and error.code() in _TOO_LARGE
            else ""
        )
        raise ConsumerError(f"cannot write {where} to {self._topic}: {error}{fix}")

    def _deliver(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], timestamp: int
    ) -> KafkaError | str | None:
        """None once delivered, else what went wrong (a too-large record fails here or in its report)."""
        reports: list[KafkaError | None] = []
        try:
            self._producer.produce(
                self._topic,
                key=key,
                value=value,
                headers=headers,
                timestamp=timestamp,
                on_delivery=lambda err, _msg: reports.append(err),
            )
        except KafkaException as exc:
            return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
        self._producer.flush(self._flush_timeout)
        return reports[0] if reports else "no ack"
