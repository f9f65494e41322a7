"""The Debezium variants of the bench and the Kafka Connect files they run with (pure: no I/O).

Each variant is Kafka Connect standalone (one JVM) with Debezium's PostgreSQL connector on a slot of its own
and the Outbox Event Router mapped to the columns of ``cdc setup``'s outbox table, writing one topic of its
own. ``default`` keeps every Connect and Debezium default (values as the payload's JSON text, through
StringConverter); ``tuned`` sets what the issue's tuned run set; ``avro`` is ``tuned`` with the payload
expanded into a Connect struct and written as Avro by Apicurio's converter, registered in the stack's
registry and framed as Confluent's wire format (magic byte, 4-byte id), so that it does the work that
``cdc run`` does for every event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg.conninfo import conninfo_to_dict

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"

# What bin/connect-standalone.sh and bin/kafka-run-class.sh of Kafka's distribution give the JVM when
# KAFKA_HEAP_OPTS and KAFKA_JVM_PERFORMANCE_OPTS are unset: a Connect worker "with defaults" runs with these.
JVM_OPTIONS = (
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)

# The tuned run: the connector hands Connect bigger batches sooner, the producer sends bigger
# batches with more of them in flight (Connect's own default is 1 in flight, for ordering).
TUNED_CONNECTOR = {
    "poll.interval.ms": "10",
    "max.batch.size": "8192",
    "max.queue.size": "65536",
}
TUNED_WORKER = {
    "producer.max.in.flight.requests.per.connection": "5",
    "producer.batch.size": "1048576",
}


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    label: str
    connector: dict[str, str] = field(default_factory=dict)
    worker: dict[str, str] = field(default_factory=dict)
    avro: bool = False


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(name="default", label="Debezium 3.6.1 + EventRouter, Connect standalone, defaults"),
        Variant(
            name="tuned",
            label="the same, tuned (poll 10 ms, batch 8192, queue 65536, in-flight 5, batch.size 1 MB)",
            connector=dict(TUNED_CONNECTOR),
            worker=dict(TUNED_WORKER),
        ),
        Variant(
            name="avro",
            label="the same tuned, Avro values (payload expanded, Apicurio's converter, Confluent framing)",
            connector={**TUNED_CONNECTOR, "transforms.outbox.table.expand.json.payload": "true"},
            worker=dict(TUNED_WORKER),
            avro=True,
        ),
    )
}


@dataclass(frozen=True, kw_only=True)
class Database:
    host: str
    port: int
    user: str
    password: str
    dbname: str


def database_from_dsn(dsn: str) -> Database:
    """The connector's view of a libpq DSN (its defaults where the DSN says nothing)."""
    params = conninfo_to_dict(dsn)
    return Database(
        host=str(params.get("host") or "127.0.0.1"),
        port=int(params.get("port") or 5432),
        user=str(params.get("user") or "postgres"),
        password=str(params.get("password") or ""),
        dbname=str(params.get("dbname") or ""),
    )


def connector_name(variant: Variant) -> str:
    return f"bench-debezium-{variant.name}"


def source_config(
    *, name: str, database: Database, slot: str, publication: str, table: str, topic_prefix: str
) -> dict[str, str]:
    """What any Debezium outbox connector of the tests needs: where it reads (the slot and publication made
    beforehand, no snapshot) and the Event Router writing to ``<topic_prefix>.${routedByValue}``, with the
    router's own defaults for the columns."""
    return {
        "name": name,
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        "database.hostname": database.host,
        "database.port": str(database.port),
        "database.user": database.user,
        "database.password": database.password,
        "database.dbname": database.dbname,
        "topic.prefix": topic_prefix.replace(".", "_"),
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": table,
        # Stream from the slot's position (created before the rows), read no table data.
        "snapshot.mode": "no_data",
        "transforms": "outbox",
        "transforms.outbox.type": EVENT_ROUTER,
        "transforms.outbox.route.topic.replacement": topic_prefix + ".${routedByValue}",
    }


def connector_config(
    variant: Variant,
    *,
    database: Database,
    slot: str,
    publication: str,
    table: str,
    topic_prefix: str,
) -> dict[str, str]:
    """The connector's properties. The Event Router routes by ``aggregate_type`` to
    ``<topic_prefix>.<aggregate_type>`` (a topic of the variant's own, created by the bench)."""
    config = source_config(
        name=connector_name(variant),
        database=database,
        slot=slot,
        publication=publication,
        table=table,
        topic_prefix=topic_prefix,
    )
    config.update(
        {
            "transforms.outbox.table.field.event.id": "id",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "transforms.outbox.table.field.event.payload": "payload",
            "transforms.outbox.table.field.event.type": "event_type",
            "transforms.outbox.route.by.field": "aggregate_type",
            # cdc run sends the event type and schema version as headers too (docs/design.md).
            "transforms.outbox.table.fields.additional.placement": (
                "event_type:header:event_type,schema_version:header:schema_version"
            ),
        }
    )
    config.update(variant.connector)
    return config


def worker_config(
    variant: Variant,
    *,
    bootstrap: str,
    offsets_file: str,
    rest_port: int,
    registry_url: str | None = None,
) -> dict[str, str]:
    """The standalone worker's properties: the converters, a file of offsets of the variant's own, the REST
    listener on loopback. ``registry_url`` is the registry's Apicurio API (``.../apis/registry/v2``)."""
    config = {
        "bootstrap.servers": bootstrap,
        "key.converter": STRING_CONVERTER,
        "value.converter": STRING_CONVERTER,
        "offset.storage.file.filename": offsets_file,
        "listeners": f"http://127.0.0.1:{rest_port}",
    }
    if variant.avro:
        if not registry_url:
            raise ValueError(f"variant {variant.name} writes Avro and needs the registry's URL")
        config.update(
            {
                "value.converter": APICURIO_AVRO_CONVERTER,
                "value.converter.apicurio.registry.url": registry_url,
                "value.converter.apicurio.registry.auto-register": "true",
                "value.converter.apicurio.registry.find-latest": "true",
                # Confluent's framing (magic byte 0, 4-byte id) with content ids, which the registry's
                # Confluent-compatible API hands out and resolves (stack/stack.sh runs it without the
                # legacy id mode); the id goes into the value, not into headers.
                "value.converter.apicurio.registry.as-confluent": "true",
                "value.converter.apicurio.registry.use-id": "contentId",
                "value.converter.apicurio.registry.headers.enabled": "false",
            }
        )
    config.update(variant.worker)
    return config


def render_properties(config: dict[str, str]) -> str:
    """A Java properties file: ``key=value`` lines; in a value, backslashes, line breaks and a leading
    space (which the format would drop) are escaped."""
    lines = []
    for key, value in config.items():
        if not key or any(c in key for c in " \t\n\r=:#!\\"):
            raise ValueError(f"unusable property name {key!r}")
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        if escaped[:1] == " ":
            escaped = "\\" + escaped
        lines.append(f"{key}={escaped}")
    return "\n".join(lines) + "\n"


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    """The config with passwords hidden, for the results file and the report."""
    return {k: ("***" if "password" in k.lower() else v) for k, v in config.items()}


def registry_api(ccompat_url: str) -> str:
    """Apicurio's own API beside its Confluent-compatible one:
    ``http://h:p/apis/ccompat/v7`` -> ``http://h:p/apis/registry/v2``."""
    base, sep, _ = ccompat_url.rstrip("/").partition("/apis/ccompat")
    if not sep:
        raise ValueError(f"{ccompat_url} is not an Apicurio ccompat URL (.../apis/ccompat/v7)")
    return base + "/apis/registry/v2"
