"""Pure parts of the Confluent framing: subject names, the wire header, credentials kept out of the URL
(registration against a real registry is in tests/integration/test_framing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema

from cdc.avro.deserialize import EventDeserializer
from cdc.avro.encoder import confluent_header
from cdc.avro.registry import SchemaRegistry
from cdc.avro.store import SchemaStore
from cdc.consumer.failures import classify
from cdc.errors import DeserializationError, RegistryUnavailableError
from tests.unit.fake_message import Message

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [
        ("topic_record", "outbox.event.order-outbox.events.OrderPlaced"),
        ("topic", "outbox.event.order-value"),
        ("record", "outbox.events.OrderPlaced"),
    ],
)
def test_subject_name_strategies(strategy: str, subject: str) -> None:
    store = SchemaStore(SCHEMAS)
    registry = SchemaRegistry("http://127.0.0.1:1", store, strategy=strategy)
    assert registry.subject("outbox.event.order", store.get("OrderPlaced", 2)) == subject


def test_confluent_header_is_magic_zero_and_big_endian_id() -> None:
    assert confluent_header(1) == b"\x00\x00\x00\x00\x01"
    assert confluent_header(0x01020304) == b"\x00\x01\x02\x03\x04"


def test_credentials_never_reach_an_error_message() -> None:
    registry = SchemaRegistry("http://reg-user:s3cr3t@127.0.0.1:1/apis/ccompat/v7", SchemaStore(SCHEMAS))
    assert registry.shown_url == "http://reg-user:***@127.0.0.1:1/apis/ccompat/v7"
    with pytest.raises(RegistryUnavailableError) as caught:
        registry.schema_id("t", "OrderPlaced", 1)  # nothing listens on port 1: connection refused
    assert "s3cr3t" not in str(caught.value)
    assert "reg-user:***@127.0.0.1:1" in str(caught.value)
    assert "failed registering OrderPlaced v1 under subject 't-outbox.events.OrderPlaced'" in str(
        caught.value
    )


class FakeClient:
    """Stands in for SchemaRegistryClient: every id has the one schema it was given."""

    def __init__(self, schema: Schema) -> None:
        self.schema, self.fetched = schema, 0

    def get_schema(self, schema_id: int) -> Schema:
        self.fetched += 1
        return self.schema

    def close(self) -> None:
        pass


def registry_with(schema: Schema) -> SchemaRegistry:
    registry = SchemaRegistry("http://127.0.0.1:1", SchemaStore(SCHEMAS))
    registry.client = FakeClient(schema)  # type: ignore[assignment]
    return registry


NOT_AVRO = [
    (Schema('{"type": "object", "properties": {"a": {"type": "string"}}}', "JSON"), "a JSON schema"),
    (Schema('{"type": "string"}', "JSON"), "a JSON schema"),  # valid Avro text, but the registry says JSON
    (Schema('syntax = "proto3"; message M { string a = 1; }', "PROTOBUF"), "a PROTOBUF schema"),
    (Schema("{not json", "AVRO"), "not valid Avro"),
    (Schema('{"type": "object"}', "AVRO"), "not valid Avro"),
    (Schema(None, "AVRO"), "not valid Avro"),
]


@pytest.mark.parametrize(("schema", "message"), NOT_AVRO)
def test_a_registry_schema_that_is_not_avro_is_a_deserialization_error(schema: Schema, message: str) -> None:
    with pytest.raises(DeserializationError, match=f"schema id 7 in the schema registry .*: {message}"):
        registry_with(schema).writer_schema(7)


@pytest.mark.parametrize(
    "schema",
    [*(schema for schema, _ in NOT_AVRO), Schema('"string"', "AVRO"), Schema('["null", "int"]', "AVRO")],
)
def test_a_confluent_record_whose_schema_is_not_an_avro_record_is_undecodable(schema: Schema) -> None:
    deserializer = EventDeserializer(SCHEMAS, registry=registry_with(schema))
    with pytest.raises(DeserializationError, match=r"^outbox\.event\.order\[2\]@41: schema id 7 ") as caught:
        deserializer(Message(confluent_header(7) + b"\x02"))
    assert classify(caught.value) == "dead_letter", "the consumer sends it to its dead-letter topic"
