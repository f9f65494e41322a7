"""Kafka's topics as the pipeline needs them: there before anything is produced into them (found, or
created when ``create_topics`` is on), their record limit known (``max.message.bytes``, so that a record it
would refuse is dead-lettered before it is sent), their replication checked once (a warning when acknowledged
events are at risk), and the compacted checkpoint topic of exactly-once delivery.

A part of :class:`cdc.stream.sink.KafkaSink`, which holds the admin client and the producer's settings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

# NewTopic lives in confluent_kafka.admin at run time; its stubs just do not re-export it.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cdc.config import Settings
from cdc.errors import BrokerUnreachableError, ConfigError, SinkError, TopicMissingError
from cdc.stream.access import (
    TOPIC_AUTHORIZATION_FAILED,
    ConnectionErrors,
    connection_refusal,
    missing_rights,
    refusal_for_right,
)
from cdc.stream.admin import ask
from cdc.stream.refusals import worst_case_size

log = logging.getLogger("cdc.sink")

# Seconds one metadata or DescribeConfigs request may take (within startup_timeout, cdc.stream.admin).
ADMIN_TIMEOUT = 10.0


class Topics:
    """The topics' side of the sink: a part of :class:`cdc.stream.sink.KafkaSink`, which hands it its admin
    client, the record of why connections failed, and the producer's own record limit."""

    def __init__(
        self,
        settings: Settings,
        admin: AdminClient,
        connection_errors: ConnectionErrors,
        message_max_bytes: int,
    ) -> None:
        self._settings = settings
        self._admin = admin
        self._connection_errors = connection_errors
        self.message_max_bytes = message_max_bytes
        self._known_topics: set[str] = set()
        self.produced_topics: set[str] = set()  # every topic ensure_topic was asked for: what is written to
        self._limits: dict[str, int | None] = {}  # topic -> its record limit, None when it needs no check
        self._limits_unreadable = False

    def close(self) -> None:
        """Let go of the admin client, so that the sink's close destroys it (this is its other reference)."""
        del self._admin

    def forget_limits(self) -> None:
        """Read every topic's limit again (a refusal may mean a topic's settings changed)."""
        self._limits.clear()

    def check_broker(self, timeout: float) -> None:
        """Refuse to start when Kafka does not answer (guarantee: never produce into the void)."""
        try:
            metadata = self._admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            self._admin.poll(0)  # serves the error callback: why the connection failed
            denied = connection_refusal(self._settings, self._connection_errors.recent(), timeout)
            if denied is not None:
                raise denied from exc
            raise BrokerUnreachableError(
                f"Kafka at {self._settings.kafka.bootstrap_servers} did not answer within {timeout:g} s "
                f"({kafka_reason(exc)}). Check kafka.bootstrap_servers (CDC_KAFKA_BOOTSTRAP_SERVERS) and "
                "that the broker is up"
            ) from exc
        self._known_topics.update(metadata.topics)

    def ensure_dead_letter_topic(self, topic: str) -> None:
        """The dead-letter topic, there from the start, so that its rights are known before the first poison
        event needs them. Without create_topics a missing one is only a warning: that event waits for it."""
        try:
            self.ensure_topic(topic)
        except TopicMissingError as exc:
            log.warning("dead-letter topic: %s", exc)

    def check_rights(self, needs: Mapping[str, tuple[str, ...]], timeout: float) -> None:
        """Refuse to start without a right the pipeline will need on a topic that exists (``needs``: topic ->
        kafka-acls operation names), rather than fail on the first event that needs it."""
        try:
            denied = ask(
                lambda left: missing_rights(self._admin, self._settings, needs, min(left, timeout)),
                what="the pipeline's rights on its topics",
                bound=timeout,
            )
        except (KafkaException, TimeoutError) as exc:
            # Kafka that does not answer the question is met again, and named, by the stream's own waits.
            log.debug("cannot ask Kafka for the pipeline's rights: %s", exc)
            return
        if denied is not None:
            raise denied

    def ensure_topic(self, topic: str) -> None:
        """Make sure ``topic`` exists: known, found in metadata, or created. Raises TopicMissingError when
        it is absent and creating topics is switched off."""
        self.produced_topics.add(topic)
        if topic in self._known_topics:
            return
        found = self._metadata(topic)
        if found is not None and found.error is not None and found.error.code() == TOPIC_AUTHORIZATION_FAILED:
            # Kafka hides a topic from a principal without any right on it; Write implies Describe.
            raise refusal_for_right(self._settings, "Write", "Topic", topic, "producing to it")
        if found is not None and found.error is None:
            risk = replication_risk(topic, found)
            if risk is not None:
                log.log(*risk)
            self._known_topics.add(topic)
            return
        if not self._settings.create_topics:
            raise TopicMissingError(
                f"topic '{topic}' does not exist and create_topics is off: create it, or set "
                "create_topics = true; the event waits until then"
            )
        self._create_topic(topic)
        self._known_topics.add(topic)

    def _metadata(self, topic: str) -> Any:
        """The topic's metadata, or None when Kafka does not know it. A topic whose partitions have no leader
        yet (just created, a broker starting) is taken as missing: creating it finds it exists."""
        try:
            return self._admin.list_topics(topic=topic, timeout=ADMIN_TIMEOUT).topics.get(topic)
        except KafkaException as exc:
            raise SinkError(f"cannot read Kafka metadata for topic '{topic}': {kafka_reason(exc)}") from exc

    def record_limit(self, topic: str) -> int | None:
        """The most bytes a record for ``topic`` may take, when the topic's ``max.message.bytes`` is below
        what the producer may send; None when the producer's own limit is the tighter one."""
        if topic not in self._limits:
            self._limits[topic] = self._read_limit(topic)
        return self._limits[topic]

    def _read_limit(self, topic: str) -> int | None:
        if self._limits_unreadable:
            return None
        try:
            limit = int(self._describe_topic(topic)["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TypeError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            if isinstance(err, KafkaError) and err.code() == TOPIC_AUTHORIZATION_FAILED:
                # The record limit decides what is dead-lettered before it is sent: not left to a guess.
                raise refusal_for_right(
                    self._settings, "DescribeConfigs", "Topic", topic, "reading its max.message.bytes"
                ) from exc
            self._limits_unreadable = True
            log.warning(
                "cannot read topic %s's max.message.bytes (%s): records are not checked against topic "
                "limits before they are sent",
                topic,
                kafka_reason(exc) if isinstance(exc, KafkaException) else exc,
            )
            return None
        return None if worst_case_size(self.message_max_bytes) <= limit else limit

    def _describe_topic(self, topic: str) -> Any:
        """The topic's configuration. A topic created a moment ago may be unknown to the broker that answers
        until its metadata has propagated, and a broker just started may have no leader for it yet: asked
        again for up to startup_timeout (cdc.stream.admin)."""
        resource = ConfigResource(ResourceType.TOPIC, topic)

        def describe(left: float) -> Any:
            request = self._admin.describe_configs([resource], request_timeout=min(left, ADMIN_TIMEOUT))
            return request[resource].result(timeout=left + 5)

        bound = self._settings.startup_timeout
        return ask(describe, what=f"configuration of {topic}", bound=bound, topic_expected=True)

    def _create_topic(self, topic: str, partitions: int = 0, config: dict[str, str] | None = None) -> None:
        s = self._settings
        new = NewTopic(
            topic,
            num_partitions=partitions or s.topic_partitions,
            replication_factor=s.topic_replication_factor or -1,  # -1: the brokers' default
            config=config or {},
        )
        try:
            ask(
                lambda left: self._admin.create_topics([new], operation_timeout=min(left, 30))[topic].result(
                    timeout=left + 30
                ),
                what=f"create topic {topic}",
                bound=s.startup_timeout,
            )
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            if isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_REPLICATION_FACTOR:
                factor = s.topic_replication_factor or "the brokers' default.replication.factor"
                raise ConfigError(
                    f"Kafka refused to create topic '{topic}' with replication factor {factor} "
                    f"({kafka_reason(exc)}): set topic_replication_factor to at most the number of brokers, "
                    "or create the topic beforehand",
                    key="topic_replication_factor",
                ) from exc
            if isinstance(err, KafkaError) and err.code() in (
                TOPIC_AUTHORIZATION_FAILED,
                KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            ):
                raise refusal_for_right(
                    s,
                    "Create",
                    "Topic",
                    topic,
                    "creating it; or create it beforehand and set create_topics = false",
                ) from exc
            raise SinkError(f"cannot create topic '{topic}': {kafka_reason(exc)}") from exc
        log.info(
            "created topic %s (%d partitions, replication factor %s%s)",
            topic,
            partitions or s.topic_partitions,
            s.topic_replication_factor or "the brokers' default.replication.factor",
            "".join(f", {k}={v}" for k, v in (config or {}).items()),
        )

    def ensure_compacted_topic(self, topic: str, config: dict[str, str]) -> None:
        """The checkpoint topic: one partition, compacted (one record per slot is what is kept), with
        ``config`` when it is made (:data:`cdc.stream.checkpoint_topic.CHECKPOINT_TOPIC_CONFIG`)."""
        if topic in self._known_topics:
            return
        metadata = self._metadata(topic)
        if metadata is None or metadata.error is not None:
            self._create_topic(topic, partitions=1, config=config)
        self._known_topics.add(topic)


def replication_risk(topic: str, metadata: Any) -> tuple[int, str] | None:
    """(log level, line) when the topic's metadata says acknowledged events are at risk: partitions with
    fewer in-sync replicas than replicas (WARNING: a leader failure there may take acknowledged records with
    it), or a single replica (INFO: fine on a development stack, not in production). None otherwise."""
    partitions = list(metadata.partitions.values())
    short = sorted(p.id for p in partitions if len(p.isrs) < len(p.replicas))
    if short:
        return logging.WARNING, (
            f"topic {topic} is under-replicated: partition(s) {', '.join(map(str, short))} have fewer "
            "in-sync replicas than replicas, so an acknowledged event there is on fewer brokers than the "
            "topic promises"
        )
    if partitions and all(len(p.replicas) == 1 for p in partitions):
        return logging.INFO, (
            f"topic {topic} has a single replica: an acknowledged event there is lost with its broker's disk "
            "(production needs replication factor 3 and min.insync.replicas = 2)"
        )
    return None


def kafka_reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)
