"""Application JSON -> outbox -> pipeline -> Kafka -> EventDeserializer, in both framings, against the real
PostgreSQL, Kafka and schema registry; the registry down while publishing; the registry refusing a schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc.avro.encoder import split_confluent
from cdc.consumer import EventDeserializer
from cdc.outbox import emit
from tests.plugins.kafka import Record
from tests.plugins.pipeline import SCHEMAS_DIR, cdc, order_placed, topic_size, wait_until
from tests.plugins.registry import registry_ca, registry_client_config


class AsMessage:
    """A consumed Record shaped like confluent_kafka.Message."""

    def __init__(self, record: Record) -> None:
        self.r = record

    def value(self) -> bytes | None:
        return self.r.value

    def key(self) -> bytes | None:
        return self.r.key

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self.r.headers.items())

    def topic(self) -> str:
        return self.r.topic

    def partition(self) -> int:
        return self.r.partition

    def offset(self) -> int:
        return self.r.offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self.r.timestamp_ms)


def write_events(outbox: Any) -> list[tuple[str, int, dict[str, Any]]]:
    """Through the producer helper, as an application does: OrderPlaced v2 then v1, one transaction."""
    common = {"schemas": SCHEMAS_DIR, "table": outbox.settings.table, "columns": outbox.settings.columns}
    v2 = {**order_placed("o-2"), "coupon": "WELCOME10"}
    v1 = order_placed("o-1")
    outbox.topic("order")
    with psycopg.connect(outbox.dsn) as conn:
        first = emit(
            conn,
            aggregate_type="order",
            aggregate_id="f-1",
            event_type="OrderPlaced",
            schema_version=2,
            payload=v2,
            headers={"traceparent": "00-trace-01"},
            **common,
        )
        second = emit(
            conn, aggregate_type="order", aggregate_id="f-1", event_type="OrderPlaced", payload=v1, **common
        )
    return [(str(first), 2, v2), (str(second), 1, v1)]


def subject_versions(registry: str, subject: str) -> list[int]:
    with SchemaRegistryClient(registry_client_config(registry)) as client:
        return list(client.get_versions(subject))


def test_single_object_round_trip_into_the_readers_version(outbox, pipeline_process, consume):
    proc = pipeline_process()
    proc.wait_streaming()
    written = write_events(outbox)
    records = consume(outbox.topic("order"), 2, timeout=30)
    assert [r.value[:2] for r in records] == [b"\xc3\x01", b"\xc3\x01"]
    as_written = EventDeserializer(SCHEMAS_DIR)
    events = [as_written(AsMessage(r)) for r in records]
    assert [(e.id, e.schema_version, e.payload) for e in events] == written
    assert events[0].headers["traceparent"] == "00-trace-01"
    assert events[0].key == "f-1"
    v1_reader = EventDeserializer(SCHEMAS_DIR, reader_versions={"OrderPlaced": 1})
    old = v1_reader(AsMessage(records[0]))
    assert (old.schema_version, old.read_version) == (2, 1)
    assert old.payload == order_placed("o-2"), "a v1 reader sees the v2 event without the coupon"
    v2_reader = EventDeserializer(SCHEMAS_DIR, reader_versions={"OrderPlaced": 2})
    assert v2_reader(AsMessage(records[1])).payload == {**order_placed("o-1"), "coupon": None}
    assert proc.terminate() == 0


def test_confluent_round_trip_registers_in_order_and_sets_compatibility(
    outbox, pipeline_process, consume, schema_registry_url
):
    proc = pipeline_process(CDC_VALUE_FORMAT="confluent", CDC_SCHEMA_REGISTRY_URL=schema_registry_url)
    proc.wait_streaming()
    written = write_events(outbox)
    topic = outbox.topic("order")
    records = consume(topic, 2, timeout=60)
    ids = [split_confluent(r.value)[0] for r in records]
    assert records[0].value[0] == 0 and ids[0] != ids[1]
    subject = f"{topic}-outbox.events.OrderPlaced"  # TopicRecordNameStrategy
    # The first event was v2, yet v1 was registered first: the registry's history is the files' history.
    assert subject_versions(schema_registry_url, subject) == [1, 2]
    with SchemaRegistryClient(registry_client_config(schema_registry_url)) as client:
        assert client.get_version(subject, 1).schema_id == ids[1]
        assert client.get_compatibility(subject) == "BACKWARD"
    with EventDeserializer(
        SCHEMAS_DIR,
        schema_registry_url=schema_registry_url,
        schema_registry_ca_file=registry_ca(schema_registry_url),
    ) as deserializer:
        events = [deserializer(AsMessage(r)) for r in records]
    assert [(e.id, e.schema_version, e.payload) for e in events] == written
    with EventDeserializer(
        SCHEMAS_DIR,
        schema_registry_url=schema_registry_url,
        schema_registry_ca_file=registry_ca(schema_registry_url),
        reader_versions={"OrderPlaced": 1},
    ) as v1_reader:
        assert v1_reader(AsMessage(records[0])).payload == order_placed("o-2")
    assert proc.terminate() == 0


@pytest.mark.parametrize("outage", ["down", "silent"])
def test_registry_down_while_publishing_makes_events_wait_never_dead_letter(
    outbox, pipeline_process, consume, schema_registry_url, tcp_proxy, kafka_bootstrap, outage
):
    """Down (connections refused) or silent (accepted, then nothing: a hung registry or proxy, which the
    client's timeout turns into an outage like the other), before the first event needs a schema id."""
    target = urlsplit(schema_registry_url)
    proxy = tcp_proxy(target.hostname, target.port)
    via_proxy = schema_registry_url.replace(f":{target.port}", f":{proxy.port}", 1)
    if outage == "down":
        proxy.stop()
    else:
        proxy.freeze(new_too=True)
    proc = pipeline_process(
        CDC_VALUE_FORMAT="confluent",
        CDC_SCHEMA_REGISTRY_URL=via_proxy,
        CDC_SUBJECT_NAME_STRATEGY="topic",
        CDC_BACKOFF_INITIAL="0.2",
        CDC_BACKOFF_MAX="1",
    )
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("r-1"), outbox.event("r-2")])
    proc.wait_for_log(r"schema registry .* failed registering OrderPlaced v1 .*; waiting, with backoff", 30)
    wait_until(lambda: "(attempt 2); waiting, with backoff" in proc.log(), 40, "more attempts")
    assert outbox.confirmed_lsn() < txn.lsn_after, "the slot must not pass events that wait"
    topic = outbox.topic("order")
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0
    if outage == "down":
        proxy.start()
    else:
        proxy.thaw()
    records = consume(topic, 2, timeout=60)
    assert [r.headers["id"].decode() for r in records] == txn.ids
    assert subject_versions(schema_registry_url, f"{topic}-value") == [1]
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the events confirmed")
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0, "an outage never dead-letters"
    assert "the schema registry answers again (OrderPlaced v1); going on" in proc.log()
    assert proc.terminate() == 0


def test_a_schema_the_registry_refuses_goes_to_the_dlq_and_the_stream_goes_on(
    outbox, pipeline_process, consume, schema_registry_url, kafka_bootstrap
):
    topic = outbox.topic("order")
    subject = f"{topic}-outbox.events.OrderPlaced"
    # Someone registered an OrderPlaced under this subject that ours cannot follow under FULL.
    other = {"type": "record", "name": "OrderPlaced", "namespace": "outbox.events", "fields": []}
    other["fields"] = [{"name": "legacy_ref", "type": "string"}]
    with SchemaRegistryClient(registry_client_config(schema_registry_url)) as client:
        client.set_compatibility(subject, "FULL")
        client.register_schema(subject, Schema(json.dumps(other), "AVRO"))
    proc = pipeline_process(
        CDC_VALUE_FORMAT="confluent",
        CDC_SCHEMA_REGISTRY_URL=schema_registry_url,
        CDC_SCHEMA_COMPATIBILITY="FULL",
    )
    proc.wait_streaming()
    shipped = {"order_id": "o-9", "carrier": "DHL", "shipped_at": 1_700_000_000_000}
    txn = outbox.commit([outbox.event("x-1"), outbox.event("x-2", shipped, event_type="OrderShipped")])
    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert dead[0].headers["error_reason"] == b"schema_rejected"
    assert dead[0].headers["id"].decode() == txn.ids[0]
    assert b"not FULL compatible" in dead[0].headers["error_message"]
    arrived = consume(topic, 1, timeout=60)
    assert arrived[0].headers["id"].decode() == txn.ids[1]
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the transaction confirmed")
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 1
    assert proc.terminate() == 0


def test_schemas_register_pre_registers_every_version(outbox, schema_registry_url, unique_name):
    env = {**outbox.env, "CDC_SCHEMA_REGISTRY_URL": schema_registry_url}
    env.pop("CDC_DATABASE_URL")  # registering needs no database
    topic = unique_name("reg")
    result = cdc(env, "schemas", "register", "--topic", topic, "--event-type", "OrderPlaced")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        f"{topic}-outbox.events.OrderPlaced: OrderPlaced v1 has id "
    )
    assert subject_versions(schema_registry_url, f"{topic}-outbox.events.OrderPlaced") == [1, 2]
    again = cdc(env, "schemas", "register", "--topic", topic, "--event-type", "OrderPlaced")
    assert again.returncode == 0 and again.stdout == result.stdout, "registering twice changes nothing"
    missing = cdc(env, "schemas", "register")
    assert missing.returncode == 2
    assert "give --topic or --aggregate-type" in missing.stderr


@pytest.mark.parametrize("value_format", ["single-object", "confluent"])
def test_a_10_mb_payload_is_too_large_by_default_and_arrives_when_allowed(
    outbox, pipeline_process, consume, value_format, tmp_path: Path, request: pytest.FixtureRequest
):
    registry = request.getfixturevalue("schema_registry_url") if value_format == "confluent" else None
    big = order_placed("o-10mb")
    big["customer_id"] = "".join(
        f"{i:08x}" for i in range(10 * 1024 * 1024 // 8)
    )  # 10 MB, poorly compressible
    env = {"CDC_VALUE_FORMAT": value_format, "CDC_SCHEMA_REGISTRY_URL": registry or ""}
    proc = pipeline_process(**env)
    proc.wait_streaming()
    first = outbox.commit([outbox.event("m-1", big), outbox.event("m-2")])
    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert dead[0].headers["error_reason"] == b"too_large" and dead[0].value is None
    assert dead[0].headers["id"].decode() == first.ids[0]
    assert [r.headers["id"].decode() for r in consume(outbox.topic("order"), 1, timeout=60)] == [first.ids[1]]
    assert proc.terminate() == 0
    # A team that expects big events raises the limit (the stack's broker takes 16 MB).
    proc = pipeline_process(**env, CDC_CONFIG=str(write_config(tmp_path, 16 * 1024 * 1024)))
    proc.wait_streaming()
    second = outbox.commit([outbox.event("m-3", big)])
    records = consume(outbox.topic("order"), 2, timeout=120)
    # m-2 and m-3 may be on two partitions: no order between them.
    arrived = [r for r in records if r.headers["id"].decode() == second.ids[0]]
    assert len(arrived) == 1
    with EventDeserializer(
        SCHEMAS_DIR, schema_registry_url=registry, schema_registry_ca_file=registry_ca(registry)
    ) as deserializer:
        assert deserializer(AsMessage(arrived[0])).payload == big
    assert proc.terminate() == 0


def write_config(tmp_path: Path, max_bytes: int) -> Path:
    path = tmp_path / "big.toml"
    path.write_text(f'[kafka]\n"message.max.bytes" = {max_bytes}\n')
    return path


def test_dlq_replay_in_the_confluent_framing_registers_the_fixed_schema(
    outbox, pipeline_process, consume, schema_registry_url, tmp_path: Path
):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    env = {"CDC_VALUE_FORMAT": "confluent", "CDC_SCHEMA_REGISTRY_URL": schema_registry_url}
    proc = pipeline_process(**env, CDC_SCHEMAS_DIR=str(schemas))
    proc.wait_streaming()
    refund = {"refund_id": "R-1", "amount_cents": 300}
    txn = outbox.commit([outbox.event("rf-1", refund, event_type="RefundIssued", aggregate_type="refund")])
    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert dead[0].headers["error_reason"] == b"schema_not_found"
    (schemas / "RefundIssued").mkdir()
    (schemas / "RefundIssued" / "v1.avsc").write_text(
        json.dumps(
            {
                "type": "record",
                "name": "RefundIssued",
                "namespace": "outbox.events",
                "fields": [{"name": "refund_id", "type": "string"}, {"name": "amount_cents", "type": "long"}],
            }
        )
    )
    cli_env = {**outbox.env, **env, "CDC_SCHEMAS_DIR": str(schemas)}
    replayed = cdc(cli_env, "dlq", "replay", txn.ids[0])
    assert replayed.returncode == 0, replayed.stderr
    topic = outbox.topic("refund")
    records = consume(topic, 1, timeout=60)
    assert records[0].value[0] == 0, "replayed in the configured framing"
    assert records[0].headers["id"].decode() == txn.ids[0]
    assert subject_versions(schema_registry_url, f"{topic}-outbox.events.RefundIssued") == [1]
    with EventDeserializer(
        schemas,
        schema_registry_url=schema_registry_url,
        schema_registry_ca_file=registry_ca(schema_registry_url),
    ) as deserializer:
        event = deserializer(AsMessage(records[0]))
    assert (event.event_type, event.schema_version, event.payload) == ("RefundIssued", 1, refund)
    assert proc.terminate() == 0
