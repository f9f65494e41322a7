"""Python values to the payload's JSON (what cdc.outbox.emit writes) and back (what EventDeserializer hands
a consumer): Decimal, datetime, date, time, UUID and bytes, each in the form the encoder reads."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdc.avro.encoder import AvroEncoder
from cdc.avro.python_values import has_fixed_uuid, payload_json, python_values
from cdc.avro.store import SchemaStore
from cdc.consumer import EventDeserializer
from cdc.errors import PayloadInvalidError
from tests.unit.avro.test_encoder import record, write_schema
from tests.unit.avro.test_payload_forms import (
    DATE,
    HASH,
    LOCAL_US,
    MONEY,
    TIME_US,
    TS_MS,
    TS_US,
    UUID,
    UUID_FIXED,
)

PAYMENT = record(
    "Payment",
    ("amount", MONEY),
    ("big", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}),
    ("rate", "double"),
    ("at", TS_US),
    ("at_ms", ["null", TS_MS]),
    ("local", LOCAL_US),
    ("day", DATE),
    ("t", TIME_US),
    ("id", UUID),
    ("uid", UUID_FIXED),
    ("digest", HASH),
    ("blob", "bytes"),
    ("raw", "bytes"),
    ("chunks", {"type": "array", "items": "bytes"}),
    ("by_name", {"type": "map", "values": ["null", "bytes"]}),
    ("nested", ["null", record("Part", ("data", "bytes"), ("n", "int"))]),
)
_ENCODINGS = ["base64", "hex", "latin1", "base64", "base64"]
for _field, _encoding in zip(PAYMENT["fields"][10:15], _ENCODINGS, strict=True):
    _field["cdc.encoding"] = _encoding
PAYMENT["fields"][15]["type"][1]["fields"][0]["cdc.encoding"] = "base64"

VALUES: dict[str, Any] = {
    "amount": Decimal("2.56"),
    "big": Decimal("1234567890123456789012345678.1234567891"),
    "rate": Decimal("0.5"),
    "at": dt.datetime(2026, 12, 3, 5, 41, 22, 817479, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "at_ms": dt.datetime(2026, 12, 3, 5, 41, 22, 817000, tzinfo=dt.UTC),
    "local": dt.datetime(2026, 12, 3, 5, 41, 22, 817479),
    "day": dt.date(2026, 12, 3),
    "t": dt.time(5, 41, 22, 817479),
    "id": uuid.UUID("0d5c0b0e-0000-4000-8000-00000000000a"),
    "uid": uuid.UUID(int=255),
    "digest": b"\x00\x01\x02\x03",
    "blob": bytearray(b"\x00\xff"),
    "raw": memoryview(b"\xe9t\xe9"),
    "chunks": [b"\x00", b""],
    "by_name": {"a": b"\x00\x10", "b": None},
    "nested": {"data": b"\x00", "n": 1},
}


@pytest.fixture
def store(tmp_path: Path) -> SchemaStore:
    write_schema(tmp_path, "Payment", 1, PAYMENT)
    return SchemaStore(tmp_path)


def test_python_values_are_written_in_the_forms_the_encoder_reads_and_come_back(store: SchemaStore) -> None:
    schema = store.get("Payment", 1).parsed
    text = payload_json(schema, VALUES, "Payment v1")
    assert orjson.loads(text) | {"big": None, "amount": None, "rate": None} == {
        "amount": None,
        "big": None,
        "rate": None,
        "at": "2026-12-03T05:41:22.817479+02:00",
        "at_ms": "2026-12-03T05:41:22.817000+00:00",
        "local": "2026-12-03T05:41:22.817479",
        "day": "2026-12-03",
        "t": "05:41:22.817479",
        "id": "0d5c0b0e-0000-4000-8000-00000000000a",
        "uid": "00000000-0000-0000-0000-0000000000ff",
        "digest": "AAECAw==",
        "blob": "00ff",
        "raw": "\u00e9t\u00e9",
        "chunks": ["AA==", ""],
        "by_name": {"a": "ABA=", "b": None},  # the field's encoding: base64, for the bytes it holds
        "nested": {"data": "AA==", "n": 1},
    }
    assert b'"big":1234567890123456789012345678.1234567891,' in text, (
        "a Decimal is a JSON number, every digit"
    )
    assert b'"amount":2.56,' in text and b'"rate":0.5,' in text
    value = AvroEncoder(store).encode("Payment", 1, text)
    with EventDeserializer(store.schemas_dir) as deserializer:
        _, _, _, back = deserializer.decode(value)
    assert back == {
        **VALUES,
        "rate": 0.5,
        "at": VALUES["at"].astimezone(dt.UTC),
        "blob": b"\x00\xff",
        "raw": b"\xe9t\xe9",
        "by_name": {"a": b"\x00\x10", "b": None},
    }
    assert type(back["uid"]) is uuid.UUID and type(back["amount"]) is Decimal


def test_a_payload_without_bytes_is_one_orjson_call(store: SchemaStore) -> None:
    schema = store.get("Payment", 1).parsed
    assert payload_json(schema, {"amount": Decimal("-0.10"), "x": [1]}, "w") == b'{"amount":-0.10,"x":[1]}'
    assert payload_json({}, {"at": dt.date(2026, 1, 2)}, "w") == b'{"at":"2026-01-02"}'


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"raw": b"a\x00b"}, "field 'raw' has a zero byte, which a jsonb payload cannot carry as latin1"),
        ({"chunks": [b"", "x", b"\x00\x01"]}, None),  # a str is left to the encoder; the bytes still encode
        ({"amount": b"\x01\x00"}, "field 'amount' expects a decimal: a Decimal or an int"),
        ({"id": b"0123456789abcdef"}, "field 'id' expects uuid, got bytes"),
        ({"amount": Decimal("NaN")}, "payload has a value without a JSON form"),
        ({"amount": {1, 2}}, "payload has a value without a JSON form: Type is not JSON serializable: set"),
        ({"t": dt.time(1, tzinfo=dt.UTC)}, "payload has a value without a JSON form"),
    ],
)
def test_a_value_without_a_form_is_a_payload_error(
    store: SchemaStore, change: dict[str, Any], message: str | None
) -> None:
    schema = store.get("Payment", 1).parsed
    if message is None:
        assert b'"chunks":["","x","AAE="]' in payload_json(schema, {**VALUES, **change}, "Payment v1")
        return
    with pytest.raises(PayloadInvalidError, match=f"^Payment v1: {message}"):
        payload_json(schema, {**VALUES, **change}, "Payment v1")


def test_a_naive_datetime_for_an_instant_is_refused_by_the_encoder(store: SchemaStore) -> None:
    text = payload_json(store.get("Payment", 1).parsed, {**VALUES, "at": VALUES["local"]}, "Payment v1")
    with pytest.raises(
        PayloadInvalidError, match="field 'at' expects timestamp-micros, got a date-time without"
    ):
        AvroEncoder(store).encode("Payment", 1, text)


def test_only_schemas_with_a_fixed_uuid_are_walked(store: SchemaStore) -> None:
    assert has_fixed_uuid(store.get("Payment", 1).parsed)
    assert not has_fixed_uuid(SchemaStore(Path(__file__).parents[3] / "schemas").get("OrderPlaced", 2).parsed)
    union = record("U", ("u", ["null", "string", UUID_FIXED]), ("l", {"type": "array", "items": "Uuid"}))
    parsed = SchemaStore(_write(store.schemas_dir, "U", union)).get("U", 1).parsed
    assert has_fixed_uuid(parsed)
    value = {"u": uuid.UUID(int=7).bytes, "l": [uuid.UUID(int=8).bytes]}
    assert python_values(parsed, value) == {"u": uuid.UUID(int=7), "l": [uuid.UUID(int=8)]}


def _write(root: Path, name: str, schema: Any) -> Path:
    write_schema(root, name, 1, schema)
    return root
