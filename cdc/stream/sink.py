"""Kafka: an idempotent producer that never drops a record and never produces into a topic that is not there.

The sink owns the confluent-kafka Producer and an AdminClient for topics. Delivery reports go straight to the
callback the caller hands over (``checkpoint.Transaction.delivered``); they run inside ``poll()`` on the
pipeline's thread, so the bookkeeping needs no lock. A full local queue (``BufferError``) is met by serving
callbacks and trying again, with a ``waiting`` hook so the pipeline keeps the replication connection alive
meanwhile; a record is never dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from cdc.config import TRANSACTION_TIMEOUT_MS, Settings
from cdc.errors import (
    BrokerUnreachableError,
    CdcError,
    DeliveryError,
    EventTooLargeError,
    SinkError,
)
from cdc.logs import kafka_log
from cdc.stream.access import (
    ConnectionErrors,
    authorization_refusal,
    rotated_password,
    sasl_password,
    with_password,
)
from cdc.stream.kafka_config import DEFAULT_MESSAGE_MAX_BYTES, admin_config, producer_config
from cdc.stream.refusals import safe_batch_size, worst_case_size
from cdc.stream.topics import Topics, kafka_reason

log = logging.getLogger("cdc.sink")
Headers = list[tuple[str, str | bytes | None]]
DeliveryCallback = Callable[[Any, Any], None]


class KafkaSink:
    """The producer, and the topics it writes to (:class:`cdc.stream.topics.Topics`, a part)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._connection_errors = ConnectionErrors()  # why a connection failed (cdc.stream.access)
        self._sasl_password = sasl_password(settings)
        self.fatal_error: KafkaError | None = None
        self._last_error_log = 0.0
        self.closed = False
        self._conf = producer_config(settings)
        # Exactly-once: set by become_transactional() once the server's identity is known.
        self.transactional_id: str | None = None
        if settings.delivery == "exactly-once":
            self._conf.setdefault("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
        # What one record or one batch may take on the wire; a topic that takes less gets checked records.
        self.message_max_bytes = int(self._conf.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
        self._producer = self._new_producer()
        try:
            admin_conf = admin_config(settings)
            admin_conf["logger"] = kafka_log
            admin_conf["error_cb"] = self._on_admin_error
            self._admin = AdminClient(admin_conf)
        except KafkaException as exc:
            raise SinkError(f"cannot create the Kafka admin client: {exc.args[0]}") from exc
        self.topics = topics = Topics(settings, self._admin, self._connection_errors, self.message_max_bytes)
        # The topics' side, as the sink's own: what the pipeline asks of the sink.
        self.check_broker = topics.check_broker
        self.ensure_dead_letter_topic = topics.ensure_dead_letter_topic
        self.check_rights = topics.check_rights
        self.ensure_topic = topics.ensure_topic
        self.ensure_compacted_topic = topics.ensure_compacted_topic
        self.record_limit = topics.record_limit

    @property
    def produced_topics(self) -> set[str]:
        return self.topics.produced_topics

    def close(self) -> None:
        """Destroy the Kafka clients now, dropping what the producer holds (nothing was confirmed past
        it): at the end of a run, or for one that will not stream. The sink is not usable after; a second
        call does nothing.

        Now, not at the process's exit: librdkafka's threads of a client still alive then run on while
        the interpreter and OpenSSL tear down what they use, and crash the process (SIGSEGV in
        ``rdk:broker*`` with TLS, after the last log line; docs/operations.md, "A crash")."""
        if self.closed:
            return
        self.closed = True
        try:
            self._producer.purge()
        except (KafkaException, SystemError) as exc:
            log.debug("purging the producer: %s", exc)
        self.topics.close()
        # The last references (the error callbacks point back at the sink, not the other way): each
        # client's destroy, which joins its threads, runs here.
        del self._producer, self._produce, self._admin

    def _new_producer(self) -> Producer:
        conf = with_password(dict(self._conf), self._settings)  # a rotated password, read again
        conf["error_cb"] = self._on_error
        # librdkafka's own log lines go through logging (and so --log-format json), not raw to stderr.
        conf["logger"] = kafka_log
        try:
            producer = Producer(conf)
        except KafkaException as exc:
            raise SinkError(f"cannot create the Kafka producer: {exc.args[0]}") from exc
        # Bound once: produce() runs once per event and attribute look-ups add up.
        self._produce = producer.produce
        return producer

    def reset(self) -> None:
        """A new producer in place of one that stopped (a refused batch, a fatal error): what the old one
        still held is dropped, not sent, since it would land behind the refused records. Topic limits are
        read again: a refusal may mean a topic's settings changed."""
        old = self._producer
        try:
            old.purge()
            old.poll(0)
        except (KafkaException, SystemError) as exc:
            log.debug("purging the stopped producer: %s", exc)
        self.fatal_error = None
        self.topics.forget_limits()
        self._replace_producer()

    def _replace_producer(self) -> None:
        """A new producer with the current configuration; a transactional one registers its id at once
        (the process owns the slot by then)."""
        self._producer = self._new_producer()
        if self.transactional_id is not None:
            self.init_transactions(self._settings.startup_timeout)

    # -- exactly-once: the transactional producer (cdc.stream.transactions) --------------------------------

    @property
    def transaction_timeout_ms(self) -> int | None:
        """librdkafka's transaction.timeout.ms for this producer (None when it is not a number)."""
        try:
            return int(self._conf.get("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS))
        except (TypeError, ValueError):
            return None

    def become_transactional(self, transactional_id: str) -> None:
        """Produce from now on with ``transactional_id`` (derived from the server's identity, which is known
        only once the slot is ours): a new producer, registered with Kafka at once. Nothing was produced
        before, so nothing is lost with the old one."""
        if transactional_id == self.transactional_id:
            return
        self.transactional_id = self._conf["transactional.id"] = transactional_id
        self._replace_producer()

    def init_transactions(self, timeout: float) -> None:
        """Register the transactional id with Kafka: fences any earlier producer with the same id and
        aborts what it left open."""
        try:
            self._producer.init_transactions(timeout)
        except KafkaException as exc:
            denied = authorization_refusal(
                self._settings, exc.args or [exc], transactional_id=self.transactional_id
            )
            if denied is not None:
                raise denied from exc
            raise BrokerUnreachableError(
                f"Kafka did not initialise transactional id {self.transactional_id!r} within {timeout:g} s "
                f"({kafka_reason(exc)}): exactly-once delivery needs a broker with transactions "
                "(transaction.state.log.* settings) and the TransactionalId Write permission"
            ) from exc

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def commit_transaction(self, timeout: float) -> None:
        """Flush and commit; raises KafkaException (the caller tells fenced, abortable and retriable)."""
        self._producer.commit_transaction(timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._producer.abort_transaction(timeout)

    def produce_checkpoint(self, topic: str, key: bytes, value: bytes, waiting: Callable[[], None]) -> None:
        """The checkpoint record, into the open transaction; a full queue is waited on as for events."""
        self.produce(topic, key, value, [], 0, None, waiting)

    def poll(self, timeout: float) -> int:
        """Serve delivery reports. A fatal producer error (a refused batch under the gapless guarantee)
        comes as an exception from poll(): it is kept in ``fatal_error`` for the pipeline to act on."""
        try:
            return int(self._producer.poll(timeout))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.fatal():
                self._fatal(err)
                return 0
            raise DeliveryError(f"Kafka producer: {kafka_reason(exc)}") from exc
        except SystemError as exc:
            # confluent-kafka serving a delivery report while the fatal error is pending: the same event.
            cause = exc.__cause__
            err = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
            if isinstance(err, KafkaError):
                self._fatal(err)
                return 0
            raise

    def _fatal(self, err: KafkaError) -> None:
        if self.fatal_error is None:
            self.fatal_error = err
            log.error("Kafka producer stopped: %s", err.str())

    def batches_fit(self, limit: int) -> bool:
        """Whether the producer's batches fit a topic that takes ``limit`` bytes at most."""
        batch = min(int(self._conf.get("batch.size", DEFAULT_MESSAGE_MAX_BYTES)), self.message_max_bytes)
        return worst_case_size(batch) <= limit

    def shrink_batches(self, limit: int) -> None:
        """A new producer whose batches fit ``limit``. Call it with an empty queue (after flush)."""
        size = safe_batch_size(limit)
        log.info(
            "producer batches now at most %d bytes, to fit a topic whose max.message.bytes is %d",
            size,
            limit,
        )
        self._conf["batch.size"] = size
        self._replace_producer()

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        timestamp_ms: int,
        on_delivery: DeliveryCallback | None,
        waiting: Callable[[], None],
    ) -> None:
        """Hand one record to the producer. When its queue is full, serve callbacks and retry; ``waiting``
        is called between tries so the caller can keep other connections alive."""
        try:
            self._produce(topic, value, key, headers=headers, timestamp=timestamp_ms, on_delivery=on_delivery)
            return
        except BufferError:
            pass
        except KafkaException as exc:
            raise _produce_error(topic, exc) from exc
        started = time.monotonic()
        while True:
            self.poll(0.05)
            if self.fatal_error is not None:
                raise ProducerStoppedError(f"the Kafka producer stopped: {self.fatal_error.str()}")
            waiting()
            try:
                self._produce(
                    topic, value, key, headers=headers, timestamp=timestamp_ms, on_delivery=on_delivery
                )
            except BufferError:
                waited = time.monotonic() - started
                if waited > 5 and time.monotonic() - self._last_error_log > 10:
                    self._last_error_log = time.monotonic()
                    log.warning(
                        "Kafka is not acknowledging: %d records queued for %.0f s; reading paused",
                        len(self._producer),
                        waited,
                    )
                continue
            except KafkaException as exc:
                raise _produce_error(topic, exc) from exc
            return

    def queue_depth(self) -> int:
        """Records handed to the producer and not yet acknowledged or failed (0 once closed)."""
        return 0 if self.closed else len(self._producer)

    def broker_reachable(self, timeout: float = 2.0) -> bool:
        """A metadata round trip to Kafka (for /readyz; librdkafka clients may be used from any thread)."""
        if self.closed:
            return False
        try:
            self._admin.list_topics(timeout=timeout)
        except (KafkaException, AttributeError):  # AttributeError: closed by the stream's thread meanwhile
            return False
        return True

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for outstanding deliveries; returns how many are left. A loop of
        poll(), not Producer.flush(): a fatal error inside flush() breaks the delivery reports after it."""
        deadline = time.monotonic() + timeout
        producer = self._producer
        while len(producer) and self.fatal_error is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.poll(min(left, 0.1))
        if self.fatal_error is not None:
            # Stopped: the reports of what it held come at once, failed; serve them, send nothing more.
            self.poll(0)
        return len(producer)

    def purge_queue(self) -> None:
        """Drop what the producer holds and has not sent: after a failed delivery it would land behind it."""
        try:
            self._producer.purge(in_queue=True, in_flight=False)
        except KafkaException as exc:
            log.debug("purging the producer's queue: %s", exc)
        self.poll(0)

    def _on_admin_error(self, err: KafkaError) -> None:
        self._connection_errors(err)
        if err.code() == KafkaError._AUTHENTICATION:
            self._reread_password()

    def _reread_password(self) -> None:
        """The broker refused our SASL credentials: a password file that says something else now (rotated)
        is what every client authenticates with next; open connections stay as they are."""
        password = rotated_password(self._settings, self._sasl_password)
        if password is not None:
            self._sasl_password = password
            user = str(self._settings.kafka.extra.get("sasl.username", ""))
            for client in (self._producer, self._admin):
                client.set_sasl_credentials(user, password)
            log.info("Kafka refused the SASL password: read kafka_sasl_password_file again, and it changed")

    def _on_error(self, err: KafkaError) -> None:
        self._connection_errors(err)
        if err.code() == KafkaError._AUTHENTICATION:
            self._reread_password()
        if err.fatal():
            self._fatal(err)
            return
        now = time.monotonic()
        # librdkafka reconnects on its own; say so at most every few seconds rather than per attempt.
        if now - self._last_error_log > 5:
            self._last_error_log = now
            log.warning("Kafka: %s (librdkafka retries with backoff)", err.str())


def _produce_error(topic: str, exc: KafkaException) -> CdcError:
    """A record the producer refuses before sending: too large is the event's fault (dead-letter topic),
    anything else stops the pipeline."""
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return EventTooLargeError(f"the record for '{topic}' is larger than the producer's message.max.bytes")
    if isinstance(err, KafkaError) and err.code() == KafkaError._FATAL:
        return ProducerStoppedError(f"cannot produce to '{topic}': the producer stopped ({err.str()})")
    return DeliveryError(f"cannot produce to '{topic}': {kafka_reason(exc)}")


class ProducerStoppedError(DeliveryError):
    """produce() after the producer stopped on a fatal error: the pipeline looks at why (a refusal?)."""
