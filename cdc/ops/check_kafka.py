"""`cdc check`'s Kafka and registry questions (:mod:`cdc.ops.check` has the rest), asked with what `cdc run`
asks them with at its start: :class:`cdc.stream.sink.KafkaSink`'s broker check and rights check, and the
registry client's access check. Read-only: a topic that does not exist is asked about with a CreateTopics
that Kafka only validates (the right to create it, its replication factor against the brokers).

Not asked: the exactly-once rights on the transactional id and the checkpoint reader's group, which only an
``init_transactions`` would prove, and that would fence a pipeline running with the same id.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

# These live in confluent_kafka.admin at run time; its stubs just do not re-export them.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cdc.config import Settings
from cdc.errors import CdcError, ConfigError, RegistryUnavailableError, SinkError
from cdc.logs import kafka_log
from cdc.ops.check_report import CheckReport
from cdc.stream.access import TOPIC_AUTHORIZATION_FAILED, missing_rights, refusal_for_right, topic_rights
from cdc.stream.kafka_config import admin_config
from cdc.stream.sink import KafkaSink
from cdc.stream.topics import kafka_reason, replication_risk

__all__ = ["check_kafka", "check_registry"]

AREA = "kafka"
PRODUCTION_REPLICAS = 3
PRODUCTION_MIN_INSYNC = 2


def known_topics(s: Settings, event_types: list[str]) -> list[str]:
    """The event topics known before any event arrives: those of ``aggregate_types`` (with each event type of
    the schemas when the template names one); none when any aggregate type may come."""
    template = s.topic_template
    if "{aggregate_type}" in template and s.aggregate_types is None:
        return []
    aggregates = s.aggregate_types or ("",)
    kinds = event_types if "{event_type}" in template else [""]
    return sorted({template.format(aggregate_type=a, event_type=e) for a in aggregates for e in kinds})


def check_kafka(s: Settings, report: CheckReport) -> None:
    try:
        sink = KafkaSink(s)
    except CdcError as exc:
        report.fail(AREA, exc)
        return
    try:
        with report.step(AREA):
            sink.check_broker(s.startup_timeout)
            try:
                _cluster(s, report, event_topics=known_topics(s, report.event_types))
            except KafkaException as exc:
                raise SinkError(f"Kafka: {kafka_reason(exc)}") from exc
    finally:
        sink.close()
    if "{aggregate_type}" in s.topic_template and s.aggregate_types is None:
        report.ok(
            AREA,
            f"the event topics ({s.topic_template}) are known as events arrive, and their rights asked then; "
            "set aggregate_types to have them checked here",
        )
    if s.delivery == "exactly-once":
        report.ok(
            AREA,
            "not checked: Write on the TransactionalId and Describe on the checkpoint reader's group (only "
            "init_transactions proves them, and it would fence a pipeline running with the same id)",
        )


def _cluster(s: Settings, report: CheckReport, *, event_topics: list[str]) -> None:
    # A metadata request for a topic must never create it, whatever the brokers' auto.create.topics.enable.
    conf: dict[str, Any] = {**admin_config(s), "logger": kafka_log, "allow.auto.create.topics": False}
    admin = AdminClient(conf)
    metadata = admin.list_topics(timeout=s.startup_timeout)
    brokers = len(metadata.brokers)
    report.ok(AREA, f"{brokers} broker(s) answer at {s.kafka.bootstrap_servers}")
    default, min_insync = _broker_defaults(admin, metadata, s.startup_timeout)
    factor = s.topic_replication_factor or default
    source = (
        "topic_replication_factor"
        if s.topic_replication_factor
        else "the brokers' default.replication.factor"
    )
    if factor is not None and factor > brokers:
        report.fail(
            AREA,
            ConfigError(
                f"topics would be created with replication factor {factor} ({source}) on {brokers} "
                "broker(s): Kafka refuses that. Set topic_replication_factor to at most the number of "
                "brokers",
                key="topic_replication_factor",
            ),
        )
    elif factor is not None and (factor < PRODUCTION_REPLICAS or (min_insync or 1) < PRODUCTION_MIN_INSYNC):
        report.warn(
            AREA,
            f"topics are created with replication factor {factor} ({source}) and min.insync.replicas "
            f"{min_insync or 'unknown'}: an acknowledged event is lost with a broker's disk. Production "
            f"needs {PRODUCTION_REPLICAS} and min.insync.replicas = {PRODUCTION_MIN_INSYNC}",
        )
    needs: dict[str, tuple[str, ...]] = {t: ("Write", "DescribeConfigs") for t in event_topics}
    needs.update(topic_rights(s))
    for topic, operations in needs.items():
        with report.step(AREA):
            try:
                found = admin.list_topics(topic=topic, timeout=s.startup_timeout).topics.get(topic)
                _topic(s, admin, found, topic, operations, report)
            except KafkaException as exc:
                raise SinkError(f"topic {topic}: {kafka_reason(exc)}") from exc


def _broker_defaults(admin: AdminClient, metadata: Any, timeout: float) -> tuple[int | None, int | None]:
    """The brokers' default.replication.factor and min.insync.replicas; None where the principal may not
    read them (DescribeConfigs on the cluster)."""
    broker = ConfigResource(ResourceType.BROKER, str(next(iter(metadata.brokers))))
    try:
        configs = admin.describe_configs([broker], request_timeout=timeout)[broker].result(timeout=timeout)
    except KafkaException:
        return None, None

    def number(key: str) -> int | None:
        entry = configs.get(key)
        return int(entry.value) if entry is not None and str(entry.value).isdigit() else None

    return number("default.replication.factor"), number("min.insync.replicas")


def _topic(
    s: Settings, admin: AdminClient, found: Any, topic: str, operations: tuple[str, ...], report: CheckReport
) -> None:
    if found is not None and found.error is None:
        risk = replication_risk(topic, found)
        if risk is not None:
            report.warn(AREA, risk[1])
        denied = missing_rights(admin, s, {topic: operations}, s.startup_timeout)
        if denied is not None:
            raise denied
        report.ok(AREA, f"topic {topic}: {', '.join(operations)} allowed")
        return
    if found is not None and found.error.code() == TOPIC_AUTHORIZATION_FAILED:
        # Kafka hides a topic from a principal without any right on it; Write or Read imply Describe.
        raise refusal_for_right(s, operations[0], "Topic", topic, "needed by cdc run")
    if not s.create_topics:
        report.warn(AREA, f"topic {topic} does not exist and create_topics is off: what goes to it waits")
        return
    partitions = 1 if topic == s.checkpoint_topic else s.topic_partitions
    new = NewTopic(topic, num_partitions=partitions, replication_factor=s.topic_replication_factor or -1)
    try:
        admin.create_topics([new], validate_only=True, request_timeout=s.startup_timeout)[topic].result(
            timeout=s.startup_timeout
        )
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        code = err.code() if isinstance(err, KafkaError) else None
        if code in (TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            raise refusal_for_right(s, "Create", "Topic", topic, "creating it at the start") from exc
        if code == KafkaError.TOPIC_ALREADY_EXISTS:  # there, and hidden from the principal
            raise refusal_for_right(s, operations[0], "Topic", topic, "needed by cdc run") from exc
        if code == KafkaError.INVALID_REPLICATION_FACTOR:
            raise ConfigError(
                f"topic {topic} could not be created ({kafka_reason(exc)}): set topic_replication_factor to "
                "at most the number of brokers",
                key="topic_replication_factor",
            ) from exc
        raise SinkError(f"topic {topic}: Kafka would not create it ({kafka_reason(exc)})") from exc
    report.ok(AREA, f"topic {topic} does not exist yet: `cdc run` may create it ({partitions} partition(s))")


def check_registry(s: Settings, report: CheckReport) -> None:
    if s.value_format != "confluent":
        report.ok("registry", f"not used (value_format = {s.value_format})")
        return
    from cdc.avro.registry import SchemaRegistry
    from cdc.avro.store import SchemaStore

    with report.step("registry"):
        registry = SchemaRegistry.from_settings(s, SchemaStore(s.schemas_dir))
        try:
            registry.check_access()  # who we are: what `cdc run` refuses to start without
            try:
                subjects = registry.client.get_subjects()
            except Exception as exc:  # the client's errors are of many kinds: any means no answer
                raise RegistryUnavailableError(
                    f"the schema registry {registry.shown_url} does not answer ({exc}): `cdc run` would "
                    "start, and every event would wait for it"
                ) from exc
            report.ok("registry", f"{registry.shown_url} answers ({len(subjects)} subject(s))")
        finally:
            registry.close()
