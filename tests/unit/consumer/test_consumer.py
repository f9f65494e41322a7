"""EventDeserializer on single-object values written by the real encoder (the Confluent framing needs the
registry and is tested in tests/integration/test_framing.py)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from cdc.avro.encoder import AvroEncoder, confluent_header, split_confluent
from cdc.avro.store import SchemaStore
from cdc.consumer import Event, EventDeserializer, classify
from cdc.errors import DeserializationError
from tests.unit.fake_message import Message

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"

V1 = {
    "order_id": "o-1",
    "customer_id": "c-1",
    "amount_cents": 1250,
    "currency": "EUR",
    "items": [{"sku": "SKU-1", "quantity": 2}],
}
V2 = {**V1, "coupon": "WELCOME10"}


def encoded(version: int, payload: dict[str, Any]) -> bytes:
    return AvroEncoder(SchemaStore(SCHEMAS)).encode("OrderPlaced", version, json.dumps(payload))


def test_reads_an_event_as_written_with_its_headers() -> None:
    message = Message(encoded(2, V2), [("id", b"e-1"), ("traceparent", b"00-abc"), ("empty", None)])
    event = EventDeserializer(SCHEMAS)(message)
    assert (event.event_type, event.schema_version, event.read_version) == ("OrderPlaced", 2, 2)
    assert event.payload == V2
    assert event.id == "e-1"
    assert event.headers == {"id": "e-1", "traceparent": "00-abc", "empty": ""}
    assert (event.key, event.topic, event.partition, event.offset) == ("o-1", "outbox.event.order", 2, 41)
    assert event.timestamp_ms == 1_700_000_000_000


def test_the_event_is_a_frozen_event_equal_to_one_built_from_its_fields() -> None:
    # Events are built as a non-frozen twin that then becomes an Event (the frozen __init__ costs 1.3 µs).
    message = Message(encoded(2, V2), [("id", b"e-1"), ("traceparent", b"00-abc")])
    event = EventDeserializer(SCHEMAS)(message)
    assert type(event) is Event and dataclasses.is_dataclass(event)
    assert event == Event(**{f.name: getattr(event, f.name) for f in dataclasses.fields(Event)})
    assert event.raw_headers == (("id", b"e-1"), ("traceparent", b"00-abc"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.id = "e-2"  # type: ignore[misc]
    assert "raw_headers" not in repr(event)


def test_events_of_two_versions_read_by_one_deserializer_keep_their_own_schemas() -> None:
    # The writer schema is cached by fingerprint: each version's values still find their own.
    deserialize = EventDeserializer(SCHEMAS)
    for _ in range(2):
        assert deserialize(Message(encoded(1, V1))).payload == V1
        assert deserialize(Message(encoded(2, V2))).payload == V2


def test_a_v1_reader_reads_v2_events_without_the_new_field() -> None:
    event = EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 1})(Message(encoded(2, V2)))
    assert (event.schema_version, event.read_version) == (2, 1)
    assert event.payload == V1


def test_a_v2_reader_reads_v1_events_with_the_default() -> None:
    event = EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 2})(Message(encoded(1, V1)))
    assert (event.schema_version, event.read_version) == (1, 2)
    assert event.payload == {**V1, "coupon": None}


def test_reader_versions_of_other_types_do_not_apply() -> None:
    event = EventDeserializer(SCHEMAS, reader_versions={"OrderShipped": 1})(Message(encoded(2, V2)))
    assert event.read_version == 2


def test_an_incompatible_reader_is_an_error_naming_both_versions(tmp_path: Path) -> None:
    for version in (1, 2):
        (tmp_path / "OrderPlaced").mkdir(exist_ok=True)
        (tmp_path / "OrderPlaced" / f"v{version}.avsc").write_bytes(
            (SCHEMAS / "OrderPlaced" / f"v{version}.avsc").read_bytes()
        )
    schema = json.loads((SCHEMAS / "OrderPlaced" / "v1.avsc").read_text())
    schema["fields"].append({"name": "region", "type": "string"})  # required, and no writer has it
    (tmp_path / "OrderPlaced" / "v3.avsc").write_text(json.dumps(schema))
    deserializer = EventDeserializer(tmp_path, reader_versions={"OrderPlaced": 3})
    with pytest.raises(
        DeserializationError, match=r"outbox\.event\.order\[2\]@41: OrderPlaced v2 cannot be read as v3"
    ):
        deserializer(Message(encoded(2, V2)))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "no schema in .* has fingerprint 0000000000000000"),
        (b'{"json": true}', "neither Avro single-object"),
        (confluent_header(7) + b"\x02", "Confluent-framed but no schema_registry_url"),
        (b"\x00\x00\x07", "3 bytes: shorter than the Confluent framing's 5-byte header"),
        (b"\x00", "1 bytes: shorter than the Confluent framing's 5-byte header"),
        (b"\xc3\x01\x00", "no schema in .* has fingerprint 00$"),
        (None, "no value"),
    ],
    ids=[
        "unknown-fingerprint",
        "not-avro",
        "confluent-without-registry",
        "confluent-3-bytes",
        "confluent-1-byte",
        "single-object-3-bytes",
        "tombstone",
    ],
)
def test_values_that_are_not_events_are_named_errors(value: bytes | None, message: str) -> None:
    with pytest.raises(DeserializationError, match=message) as caught:
        EventDeserializer(SCHEMAS)(Message(value))
    assert classify(caught.value) == "dead_letter", "an undecodable record must not block its partition"


def test_truncated_body_is_an_error_not_a_partial_event() -> None:
    value = encoded(1, V1)
    with pytest.raises(DeserializationError, match="OrderPlaced v1 cannot be read as v1"):
        EventDeserializer(SCHEMAS)(Message(value[:-3]))


def test_reader_version_without_a_schema_file_is_an_error() -> None:
    with pytest.raises(DeserializationError, match="reader schema: no schema for OrderPlaced v9"):
        EventDeserializer(SCHEMAS, reader_versions={"OrderPlaced": 9})(Message(encoded(1, V1)))


def test_confluent_header_round_trip() -> None:
    schema_id, body = split_confluent(confluent_header(70_000) + b"body")
    assert (schema_id, bytes(body)) == (70_000, b"body")
    with pytest.raises(ValueError, match="not Confluent-framed"):
        split_confluent(b"\x01\x00\x00\x00\x01")


def test_the_first_header_of_a_name_is_the_one_read() -> None:
    # The pipeline writes its own headers first; whatever a record carries after them never replaces them.
    message = Message(encoded(1, V1), [("id", b"e-1"), ("event_type", b"OrderPlaced"), ("id", b"req-42")])
    event = EventDeserializer(SCHEMAS)(message)
    assert event.id == "e-1" and event.headers["id"] == "e-1"


def test_logical_types_come_back_as_python_types(tmp_path: Path) -> None:
    """Decimal, datetime, date, time and UUID, on a string and on a fixed(16) (fastavro: bytes)."""
    fields = [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "uid", "type": {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}},
        {"name": "ids", "type": {"type": "array", "items": ["null", "U"]}},
    ]
    (tmp_path / "Paid").mkdir()
    schema = {"type": "record", "name": "Paid", "namespace": "t", "fields": fields}
    (tmp_path / "Paid" / "v1.avsc").write_text(json.dumps(schema))
    payload = {
        "amount": 2.56,
        "at": 1764740482817479,
        "local": 0,
        "day": 1,
        "t": 1000,
        "id": "0d5c0b0e-0000-4000-8000-00000000000a",
        "uid": "\u0000" * 15 + "\u00ff",
        "ids": [None, "\u0000" * 15 + "\u0007"],
    }
    value = AvroEncoder(SchemaStore(tmp_path)).encode("Paid", 1, json.dumps(payload))
    event = EventDeserializer(tmp_path)(Message(value))
    assert event.payload == {
        "amount": decimal.Decimal("2.56"),
        "at": datetime.datetime(2025, 12, 3, 5, 41, 22, 817479, tzinfo=datetime.UTC),
        "local": datetime.datetime(1970, 1, 1),
        "day": datetime.date(1970, 1, 2),
        "t": datetime.time(0, 0, 1),
        "id": uuid.UUID("0d5c0b0e-0000-4000-8000-00000000000a"),
        "uid": uuid.UUID(int=255),
        "ids": [None, uuid.UUID(int=7)],
    }
