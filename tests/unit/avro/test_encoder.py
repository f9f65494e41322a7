"""Unit tests of cdc.avro (store, encoder): schema store, strict validation, single-object framing, fastavro
equality."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import random
import struct
import uuid
from pathlib import Path
from typing import Any, cast

import fastavro
import orjson
import pytest
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from cdc.avro.catalog import check_schemas
from cdc.avro.encoder import MAGIC, AvroEncoder
from cdc.avro.store import SchemaStore
from cdc.errors import EventError, PayloadInvalidError, SchemaNotFoundError

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
SECRET = "s3cr3t-Value-4242"

ORDER: dict[str, Any] = {
    "order_id": "ord-1",
    "customer_id": "cus-9",
    "amount_cents": 1234599,
    "currency": "EUR",
    "items": [{"sku": "SKU-A", "quantity": 2}, {"sku": "SKU-B", "quantity": 1}],
}


@pytest.fixture(scope="module")
def store() -> SchemaStore:
    return SchemaStore(SCHEMAS)


@pytest.fixture(scope="module")
def encoder(store: SchemaStore) -> AvroEncoder:
    return AvroEncoder(store)


def write_schema(root: Path, event_type: str, version: int, schema: Any) -> Path:
    path = root / event_type / f"v{version}.avsc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema if isinstance(schema, str) else json.dumps(schema))
    return path


def record(name: str, *fields: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "namespace": "t",
        "fields": [
            {"name": n, "type": t, **({"default": extra[n]} if n in extra else {})} for n, t in fields
        ],
    }


def fastavro_body(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, value)
    return out.getvalue()


def decode(schema: Any, body: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(body), schema, None)


def rabin(text: str) -> int:
    """CRC-64-AVRO as the Avro specification defines it, independent of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    result = empty
    for byte in text.encode():
        result = (result >> 8) ^ table[(result ^ byte) & 0xFF]
    return result


# --- sample schemas, framing, round trip --------------------------------------------------------------------


def test_sample_schemas_are_listed_and_load(store: SchemaStore) -> None:
    assert store.available() == [
        ("CustomerRegistered", 1),
        ("OrderPlaced", 1),
        ("OrderPlaced", 2),
        ("OrderShipped", 1),
    ]
    for event_type, version in store.available():
        stored = store.get(event_type, version)
        assert stored.parsed["name"] == f"outbox.events.{event_type}"
        assert stored.canonical == to_parsing_canonical_form(stored.parsed)
        assert len(stored.fingerprint) == 8


@pytest.mark.parametrize(
    ("event_type", "version", "payload"),
    [
        ("OrderPlaced", 1, ORDER),
        ("OrderPlaced", 2, {**ORDER, "coupon": "SPRING"}),
        ("OrderPlaced", 2, {**ORDER, "coupon": None}),
        ("OrderShipped", 1, {"order_id": "ord-1", "carrier": "DHL", "shipped_at": 1733140800123}),
        (
            "CustomerRegistered",
            1,
            {"customer_id": "cus-9", "email": "a@example.org", "marketing_opt_in": False},
        ),
    ],
)
def test_round_trip_and_single_object_header(
    encoder: AvroEncoder, store: SchemaStore, event_type: str, version: int, payload: dict[str, Any]
) -> None:
    out = encoder.encode(event_type, version, orjson.dumps(payload))
    schema = store.get(event_type, version).parsed
    canonical = to_parsing_canonical_form(schema)
    assert out[:2] == MAGIC == b"\xc3\x01"
    assert out[2:10] == bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    assert int.from_bytes(out[2:10], "little") == rabin(canonical)
    expected = dict(payload)
    if "shipped_at" in expected:
        expected["shipped_at"] = datetime.datetime.fromtimestamp(1733140800.123, datetime.UTC)
    assert decode(schema, out[10:]) == expected
    assert out[10:] == fastavro_body(schema, payload)
    assert encoder.encode_body(event_type, version, json.dumps(payload)) == out[10:]


def test_crc64_avro_matches_the_spec_test_vectors() -> None:
    # from the Avro repository's share/test/data/schema-tests.txt, as signed 64-bit integers
    for text, value in (('"null"', 7195948357588979594), ('"int"', 8247732601305521295)):
        assert int.from_bytes(bytes.fromhex(fingerprint(text, "CRC-64-AVRO")), "little", signed=True) == value
        assert rabin(text) == value & 0xFFFFFFFFFFFFFFFF


def test_omitted_field_with_default_writes_the_default(encoder: AvroEncoder, store: SchemaStore) -> None:
    out = encoder.encode("OrderPlaced", 2, orjson.dumps(ORDER))
    assert decode(store.get("OrderPlaced", 2).parsed, out[10:]) == {**ORDER, "coupon": None}
    assert out[10:] == encoder.encode_body("OrderPlaced", 1, orjson.dumps(ORDER)) + b"\x00"


def test_fingerprint_lookup(store: SchemaStore, tmp_path: Path) -> None:
    for event_type, version in store.available():
        assert store.by_fingerprint(store.get(event_type, version).fingerprint) == (event_type, version)
    local = SchemaStore(tmp_path)
    with pytest.raises(SchemaNotFoundError, match="0001020304050607"):
        local.by_fingerprint(bytes(range(8)))
    write_schema(tmp_path, "Broken", 1, "{not json")
    path = write_schema(tmp_path, "Late", 1, record("Late", ("a", "int")))
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(json.loads(path.read_text())), "CRC-64-AVRO"))
    # added after the first scan: found, and the broken file is skipped
    assert local.by_fingerprint(fp) == ("Late", 1)
    with pytest.raises(SchemaNotFoundError, match="1 schema files could not be loaded"):
        local.by_fingerprint(b"\xff" * 8)


# --- schema errors ------------------------------------------------------------------------------------------


def test_missing_schema_names_event_type_version_and_path(encoder: AvroEncoder) -> None:
    with pytest.raises(SchemaNotFoundError) as info:
        encoder.encode("OrderPlaced", 9, b"{}")
    assert "OrderPlaced v9" in str(info.value)
    assert str(SCHEMAS / "OrderPlaced" / "v9.avsc") in str(info.value)
    assert info.value.reason == "schema_not_found" and isinstance(info.value, EventError)
    with pytest.raises(SchemaNotFoundError, match="NoSuchEvent v1"):
        encoder.encode("NoSuchEvent", 1, b"{}")


@pytest.mark.parametrize(
    ("event_type", "version"),
    [("../etc", 1), ("Order Placed", 1), ("", 1), ("OrderPlaced", 0), ("OrderPlaced", -1)],
)
def test_bad_event_type_or_version_is_schema_not_found(
    encoder: AvroEncoder, event_type: str, version: int
) -> None:
    with pytest.raises(SchemaNotFoundError):
        encoder.encode(event_type, version, b"{}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid Avro"),
        (
            json.dumps({"type": "record", "name": "Bad", "fields": [{"name": "a", "type": "nope"}]}),
            "not valid Avro",
        ),
        (json.dumps("string"), "must be a record named"),
        (json.dumps(record("Other", ("a", "int"))), "must be a record named 'Bad'"),
        (json.dumps(record("Bad", ("a", "long"), a=1.5)), "(?i)default"),
        (json.dumps(record("Bad", ("a", "bytes"), a="\u0100")), "default"),
    ],
)
def test_invalid_schema_file_is_schema_not_found(tmp_path: Path, content: str, message: str) -> None:
    path = write_schema(tmp_path, "Bad", 1, content)
    with pytest.raises(SchemaNotFoundError, match=message) as info:
        AvroEncoder(SchemaStore(tmp_path)).encode("Bad", 1, b"{}")
    assert "Bad v1" in str(info.value) and str(path) in str(info.value)


def nested_arrays(levels: int) -> str:
    """A schema file ``levels`` JSON arrays and objects deep (record, fields, field, then arrays of arrays),
    written as text: json.dumps would reach Python's recursion limit first."""
    arrays = levels - 3
    return (
        '{"type": "record", "name": "Deep", "fields": [{"name": "d", "type": '
        + '{"type": "array", "items": ' * arrays
        + '"long"'
        + "}" * arrays
        + "}]}"
    )


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (255, "is nested too deeply: more than 254 levels of JSON arrays and objects"),  # orjson writes 254
        (600, "is nested too deeply: more than 254 levels of JSON arrays and objects"),
        (1100, "is not valid Avro: depth limit exceeded"),  # orjson reads 1024
    ],
)
def test_a_schema_nested_too_deeply_is_schema_not_found(tmp_path: Path, levels: int, message: str) -> None:
    path = write_schema(tmp_path, "Deep", 1, nested_arrays(levels))
    store = SchemaStore(tmp_path)
    with pytest.raises(SchemaNotFoundError, match=message) as info:
        store.get("Deep", 1)
    assert "Deep v1" in str(info.value) and str(path) in str(info.value)
    # As any bad file: `cdc run`'s start-up check names it, a lookup by fingerprint skips it.
    assert [str(path) in str(exc) for exc in store.check_all()] == [True]
    with pytest.raises(SchemaNotFoundError, match=r"\(1 schema files could not be loaded\)"):
        store.by_fingerprint(b"\x00" * 8)


def test_the_deepest_schema_the_store_takes_is_encoded(tmp_path: Path) -> None:
    """254 levels: the validator, fastavro, the generated encoder and the compiled one all recurse this deep
    without reaching Python's recursion limit."""
    write_schema(tmp_path, "Deep", 1, nested_arrays(254))
    store = SchemaStore(tmp_path)
    value: Any = 7
    for _ in range(254 - 3):
        value = [value]
    payload, stored = orjson.dumps({"d": value}), store.get("Deep", 1)
    expected = MAGIC + stored.fingerprint + fastavro_body(stored.parsed, {"d": value})
    for compiled in (False, True):
        assert AvroEncoder(store, compiled=compiled).encoder_for("Deep", 1)(payload) == expected


def test_null_does_not_mean_left_out(tmp_path: Path) -> None:
    write_schema(tmp_path, "D", 1, record("D", ("s", "string"), s="x"))
    encoder = AvroEncoder(SchemaStore(tmp_path))
    assert encoder.encode_body("D", 1, b"{}") == b"\x02x"
    with pytest.raises(PayloadInvalidError, match="^D v1: field 's' expects string, got null$"):
        encoder.encode("D", 1, b'{"s": null}')


def test_fixed_schema_file_is_picked_up(tmp_path: Path) -> None:
    encoder = AvroEncoder(SchemaStore(tmp_path))
    with pytest.raises(SchemaNotFoundError):
        encoder.encode("Late", 1, b'{"a": 1}')
    write_schema(tmp_path, "Late", 1, record("Late", ("a", "int")))
    assert encoder.encode_body("Late", 1, b'{"a": 1}') == b"\x02"


# --- strict validation --------------------------------------------------------------------------------------

SINK = record(
    "Sink",
    ("flag", "boolean"),
    ("i", "int"),
    ("l", "long"),
    ("f", "float"),
    ("d", "double"),
    ("s", "string"),
    ("raw", "bytes"),
    ("hash", {"type": "fixed", "name": "Hash", "size": 4}),
    ("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}),
    ("tags", {"type": "map", "values": "int"}),
    ("nothing", "null"),
    ("choice", ["null", "boolean", "int", "long", "string", "double"]),
    ("rec_or_map", [record("Point", ("x", "int")), {"type": "map", "values": "string"}]),
    ("opt", ["null", "string"]),
    ("small", ["null", "int"]),
    ("il", ["null", "int", "long"]),
    ("nested", {"type": "array", "items": {"type": "map", "values": record("Leaf", ("qty", "int"))}}),
)
GOOD = {
    "flag": True,
    "i": 1,
    "l": 2,
    "f": 1.5,
    "d": 2.5,
    "s": "x",
    "raw": "\u00ff\u0000",
    "hash": "abcd",
    "color": "GREEN",
    "tags": {"a": 1},
    "nothing": None,
    "choice": 5,
    "rec_or_map": {"x": 1},
    "opt": None,
    "small": 1,
    "il": 2**40,
    "nested": [{"k": {"qty": 1}}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"flag": "true"}, "field 'flag' expects boolean, got string"),
        ({"flag": 1}, "field 'flag' expects boolean, got integer"),
        ({"i": True}, "field 'i' expects int, got boolean"),
        ({"i": 1.0}, "field 'i' expects int, got number"),
        ({"i": 2**31}, "field 'i' expects int, got integer out of range"),
        ({"i": -(2**31) - 1}, "field 'i' expects int, got integer out of range"),
        ({"l": 2**63}, "field 'l' expects long, got integer out of range"),
        ({"l": "12"}, "field 'l' expects long, got string"),
        ({"f": 1e39}, "field 'f' expects float, got number out of range"),
        ({"f": "1.5"}, "field 'f' expects float, got string"),
        ({"d": False}, "field 'd' expects double, got boolean"),
        ({"s": 5}, "field 's' expects string, got integer"),
        ({"s": None}, "field 's' expects string, got null"),
        ({"raw": "\u0100"}, "field 'raw' expects bytes (code points U+0000..U+00FF), got string"),
        ({"raw": [1]}, "field 'raw' expects bytes, got array"),
        ({"hash": "abc"}, "field 'hash' expects fixed Hash of 4 bytes, got another length"),
        ({"color": "BLUE"}, "field 'color' expects one of the symbols of enum Color, got string"),
        ({"color": 0}, "field 'color' expects one of the symbols of enum Color, got integer"),
        ({"tags": []}, "field 'tags' expects map, got array"),
        ({"tags": {"a": 1, "b": "2"}}, "field 'tags{#1}' expects int, got string"),
        ({"nothing": 0}, "field 'nothing' expects null, got integer"),
        ({"choice": 2.5}, None),
        ({"choice": 2**64 - 1}, None),  # the double branch takes any integer
        ({"small": 2**31}, "field 'small' expects null or int, got integer out of range"),
        ({"small": "1"}, "field 'small' expects null or int, got string"),
        ({"il": 2**63}, "field 'il' expects null or int or long, got integer that fits none of its branches"),
        (
            {"choice": [1]},
            "field 'choice' expects null or boolean or int or long or string or double, got array",
        ),
        ({"rec_or_map": {"y": "z"}}, None),
        (
            {"rec_or_map": {"y": 1}},
            "field 'rec_or_map' expects record Point or map, got object that fits none",
        ),
        ({"opt": 3}, "field 'opt' expects null or string, got integer"),
        (
            {"nested": [{}, {"a": {"qty": 1}, "b": {"qty": "1"}}]},
            "field 'nested[1]{#1}.qty' expects int, got string",
        ),
        ({"nested": [{"a": {}}]}, "field 'nested[0]{#0}.qty' is required but missing"),
        (
            {"nested": [{"a": {"qty": 1, "colour": "red"}}]},
            "field 'nested[0]{#0}.colour' is not in the schema",
        ),
        ({"extra": 1}, "field 'extra' is not in the schema (1 unknown field(s))"),
        ({"bad key!": 1}, "payload has 1 unknown field(s) (names not shown: not valid Avro names)"),
    ],
)
def test_strict_validation(tmp_path: Path, change: dict[str, Any], message: str | None) -> None:
    write_schema(tmp_path, "Sink", 1, SINK)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    payload = orjson.dumps({**GOOD, **change})
    if message is None:
        body = encoder.encode_body("Sink", 1, payload)
        decoded = decode(parse_schema(SINK), body)
        for key, value in change.items():
            # 2**64 - 1 went to the double branch, {"y": "z"} to the map
            assert decoded[key] == (float(value) if key == "choice" else value)
        return
    with pytest.raises(PayloadInvalidError) as info:
        encoder.encode("Sink", 1, payload)
    assert str(info.value).startswith("Sink v1: ")
    assert message in str(info.value)
    assert info.value.reason == "payload_invalid"


def error(encoder: AvroEncoder, event_type: str, version: int, payload: Any) -> str:
    with pytest.raises(PayloadInvalidError) as info:
        encoder.encode(event_type, version, orjson.dumps(payload))
    return str(info.value)


def test_messages_of_the_sample_schemas(encoder: AvroEncoder) -> None:
    no_currency = {k: v for k, v in ORDER.items() if k != "currency"}
    assert (
        error(encoder, "OrderPlaced", 1, no_currency)
        == "OrderPlaced v1: field 'currency' is required but missing"
    )
    assert (
        error(encoder, "OrderPlaced", 1, [])
        == "OrderPlaced v1: payload expects record OrderPlaced, got array"
    )
    items = [*ORDER["items"], {"sku": "SKU-C", "quantity": "3"}]
    assert (
        error(encoder, "OrderPlaced", 1, {**ORDER, "items": items})
        == "OrderPlaced v1: field 'items[2].quantity' expects int, got string"
    )
    assert error(encoder, "OrderPlaced", 2, {**ORDER, "amount_cents": None}).endswith(
        "expects long, got null"
    )
    assert error(encoder, "OrderPlaced", 1, {**ORDER, "coupon": None}).endswith(
        "'coupon' is not in the schema (1 unknown field(s))"
    )
    shipped = {"order_id": "o", "carrier": "DHL", "shipped_at": "2024-12-02 12:00"}
    assert error(encoder, "OrderShipped", 1, shipped).endswith(
        "field 'shipped_at' expects timestamp-millis, got string that is not an ISO-8601 date-time, "
        "YYYY-MM-DDTHH:MM:SS[.ffffff] and a UTC offset (Z, +HH:MM)"
    )
    shipped["shipped_at"] = [1]
    assert error(encoder, "OrderShipped", 1, shipped).endswith(
        "'shipped_at' expects timestamp-millis, got array"
    )
    customer = {"customer_id": "c", "email": "e", "marketing_opt_in": "yes"}
    assert error(encoder, "CustomerRegistered", 1, customer).endswith("expects boolean, got string")


@pytest.mark.parametrize("payload", [b"", b"{", b'{"order_id": s3cr3t-Value-4242}', b"\xff\xfe", "[1,]"])
def test_invalid_json_is_payload_invalid(encoder: AvroEncoder, payload: bytes | str) -> None:
    with pytest.raises(PayloadInvalidError, match="^OrderPlaced v1: payload is not valid JSON") as info:
        encoder.encode("OrderPlaced", 1, payload)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert SECRET not in str(info.value.__cause__)


@pytest.mark.parametrize(
    "change",
    [
        {"flag": SECRET},
        {"i": SECRET},
        {"f": SECRET},
        {"raw": SECRET + "\u0100"},
        {"hash": SECRET},
        {"color": SECRET},
        {"tags": {SECRET: SECRET}},
        {"tags": {"a": SECRET}},
        {"choice": {"x": SECRET}},
        {"rec_or_map": {"x": SECRET, "y": 1}},
        {"small": SECRET},
        {"il": SECRET},
        {"opt": [SECRET]},
        {"nested": [{SECRET: {"qty": SECRET}}]},
        {SECRET: 1},
        {"s3cr3t_Value_4242": SECRET},
    ],
)
def test_error_messages_never_contain_payload_values(tmp_path: Path, change: dict[str, Any]) -> None:
    write_schema(tmp_path, "Sink", 1, SINK)
    with pytest.raises(PayloadInvalidError) as info:
        AvroEncoder(SchemaStore(tmp_path)).encode("Sink", 1, orjson.dumps({**GOOD, **change}))
    text = f"{info.value} {info.value!r} {info.value.args}"
    assert SECRET not in text
    assert info.value.__cause__ is None


# --- byte-for-byte equality with fastavro -------------------------------------------------------------------

EDGE_INTS = sorted(
    {
        s * ((1 << k) + d)
        for k in range(64)
        for d in (-1, 0, 1)
        for s in (1, -1)
        if -(2**63) <= s * ((1 << k) + d) < 2**63
    }
)
KITCHEN = record(
    "Kitchen",
    ("flag", "boolean"),
    ("i", "int"),
    ("l", "long"),
    ("f", "float"),
    ("d", "double"),
    ("s", "string"),
    ("raw", "bytes"),
    ("hash", {"type": "fixed", "name": "Hash", "size": 3}),
    ("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}),
    ("longs", {"type": "array", "items": "long"}),
    ("opt_map", {"type": "map", "values": ["null", "string"]}),
    ("choice", ["null", "boolean", "int", "long", "string", "double"]),
    (
        "deep",
        {
            "type": "array",
            "items": {
                "type": "map",
                "values": record("Leaf", ("x", "int"), ("c", "Color"), ("h", ["null", "Hash"])),
            },
        },
    ),
    ("leaf", ["null", "Leaf"]),
    ("ts", {"type": "long", "logicalType": "timestamp-micros"}),
    ("day", {"type": "int", "logicalType": "date"}),
    ("id", {"type": "string", "logicalType": "uuid"}),
    ("d_str", "string"),
    ("d_arr", {"type": "array", "items": "int"}),
    ("d_leaf", "Leaf"),
    ("d_color", "Color"),
    d_str="h\u00e9",
    d_arr=[1, -2, 300],
    d_leaf={"x": 7, "c": "GREEN", "h": None},
    d_color="BLUE",
)


LOGICAL_KITCHEN = record(
    "LogicalKitchen",
    ("money", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
    ("big", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}),
    (
        "cents",
        {"type": "fixed", "name": "Cents", "size": 5, "logicalType": "decimal", "precision": 11, "scale": 0},
    ),
    (
        "coded",
        {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4, "cdc.encoding": "base64"},
    ),
    ("maybe", ["null", {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 3}]),
    ("maybe_double", ["null", "string", "double"]),  # a union that takes the Decimal numbers of this schema
    ("f", "float"),
    ("d", "double"),
    ("numbers", {"type": "array", "items": ["null", "int", "long", "double"]}),
    ("ts_ms", {"type": "long", "logicalType": "timestamp-millis"}),
    ("ts_us", ["null", {"type": "long", "logicalType": "timestamp-micros"}]),
    ("local_ms", {"type": "long", "logicalType": "local-timestamp-millis"}),
    ("local_us", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ("day", {"type": "int", "logicalType": "date"}),
    ("t_ms", {"type": "int", "logicalType": "time-millis"}),
    ("t_us", {"type": "long", "logicalType": "time-micros"}),
    ("id", {"type": "string", "logicalType": "uuid"}),
    ("uid", {"type": "fixed", "name": "Uid", "size": 16, "logicalType": "uuid"}),
    ("b64", {"type": "bytes", "cdc.encoding": "base64"}),
    ("hexes", {"type": "map", "values": {"type": "fixed", "name": "Three", "size": 3}}),
    ("s", "string"),
)
LOGICAL_KITCHEN["fields"][-2]["cdc.encoding"] = "hex"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def random_logical(schema: dict[str, Any], rnd: random.Random) -> tuple[Any, Any] | None:
    """(a JSON form, the Python value for fastavro) of a random value of a logical type or an encoded bytes,
    None for the others. Every form is picked at random: numbers, strings, integers, ISO-8601."""
    kind, name, size = schema["type"], schema.get("logicalType"), schema.get("size")
    if name == "decimal":
        precision, scale = schema["precision"], schema.get("scale", 0)
        unscaled = rnd.choice(
            [0, 1, -1, 256, -(10**precision) + 1, 10**precision - 1, rnd.randint(-999, 999)]
        )
        if unscaled < 0 and (-unscaled) & (-unscaled - 1) == 0 and (-unscaled).bit_length() % 8 == 0:
            unscaled += 1  # -128, -32768...: fastavro writes a byte more than Java (test_payload_forms)
        meant = decimal.Decimal(f"{unscaled}E-{scale}")  # scaleb would round to 28 digits
        text = str(meant)
        form = rnd.choice(["number", "bytes"] if "cdc.encoding" in schema else ["number", "string"])
        if form == "bytes":
            raw = unscaled.to_bytes(
                ((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8) // 8, "big", signed=True
            )
            return base64.b64encode(raw).decode(), meant
        return (orjson.Fragment(text.encode()) if form == "number" else text), meant
    if name == "uuid" and (kind == "string" or size == 16):
        value = uuid.UUID(int=rnd.getrandbits(128))
        return str(value), (str(value) if kind == "string" else value.bytes)
    places = {"timestamp-millis": 3, "timestamp-micros": 6, "local-timestamp-millis": 3}
    places |= {"local-timestamp-micros": 6, "time-millis": 3, "time-micros": 6}
    if name in places:
        unit = 10 ** places[name]
        spec = "milliseconds" if unit == 1000 else "microseconds"
        if name in ("time-millis", "time-micros"):
            value = rnd.randrange(86400 * unit)
            text = (datetime.datetime.min + datetime.timedelta(microseconds=value * 10**6 // unit)).time()
            return rnd.choice([value, text.isoformat(timespec=spec)]), value
        value = rnd.randrange(-62135596800 * unit, 253402300800 * unit)  # years 1 to 9999
        instant = EPOCH + datetime.timedelta(microseconds=value * 10**6 // unit)
        if name.startswith("local"):
            return rnd.choice([value, instant.replace(tzinfo=None).isoformat(timespec=spec)]), value
        offset = datetime.timezone(datetime.timedelta(minutes=rnd.randint(-900, 900)))
        try:
            shown = instant.astimezone(offset).isoformat(timespec=spec)
        except OverflowError:  # the first and the last hours of the range, in another offset
            shown = instant.isoformat(timespec=spec)
        return rnd.choice([value, shown]), value
    if name == "date":
        days = rnd.randint(-719162, 2932896)
        return rnd.choice([days, (EPOCH + datetime.timedelta(days=days)).date().isoformat()]), days
    if kind in ("bytes", "fixed") and schema.get("cdc.encoding") in ("base64", "hex"):
        raw = bytes(rnd.getrandbits(8) for _ in range(size if kind == "fixed" else rnd.randint(0, 70)))
        return (base64.b64encode(raw).decode() if schema["cdc.encoding"] == "base64" else raw.hex()), raw
    return None


def random_value(schema: Any, rnd: random.Random, named: dict[str, Any]) -> tuple[Any, Any]:
    """(JSON form for the encoder, Python form for fastavro) of a random value of ``schema``."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        return random_value(rnd.choice(schema), rnd, named)
    if isinstance(schema, dict) and (pair := random_logical(schema, rnd)) is not None:
        return pair
    kind = schema if isinstance(schema, str) else schema["type"]
    v: Any
    if kind == "null":
        return None, None
    if kind == "boolean":
        return (v := rnd.random() < 0.5), v
    if kind in ("int", "long"):
        bits = 32 if kind == "int" else 64
        v = rnd.choice(
            [x for x in EDGE_INTS if -(2 ** (bits - 1)) <= x < 2 ** (bits - 1)]
            + [rnd.getrandbits(bits) - 2 ** (bits - 1), rnd.randint(-100, 100)]
        )
        return v, v
    if kind == "float":
        v = rnd.choice([0.0, -1.5, 3.4e38, 1e-40, rnd.uniform(-1e6, 1e6), rnd.randint(-1000, 1000)])
        return v, v
    if kind == "double":
        v = rnd.choice([0.0, -0.0, 1.7e308, 5e-324, rnd.uniform(-1e300, 1e300), rnd.randint(-(2**63), 2**63)])
        return v, v
    if kind == "string":
        alphabet = 'aZ0 é€\U0001f600\u0000"\\'
        v = "".join(rnd.choice(alphabet) for _ in range(rnd.choice([0, 1, 5, 40, 40, 40, 40, 40, 9000])))
        return v, v
    if kind in ("bytes", "fixed"):
        raw = bytes(
            rnd.getrandbits(8) for _ in range(schema["size"] if kind == "fixed" else rnd.randint(0, 70))
        )
        return raw.decode("latin-1"), raw
    if kind == "enum":
        return (v := rnd.choice(schema["symbols"])), v
    if kind == "array":
        pairs = [random_value(schema["items"], rnd, named) for _ in range(rnd.choice([0, 1, 3, 9]))]
        return [j for j, _ in pairs], [p for _, p in pairs]
    if kind == "map":
        keys = {f"k{rnd.randint(0, 10**6)}\u00e9" for _ in range(rnd.choice([0, 1, 3, 9]))}
        entries = {k: random_value(schema["values"], rnd, named) for k in keys}
        return {k: j for k, (j, _) in entries.items()}, {k: p for k, (_, p) in entries.items()}
    if kind == "record":
        json_value, py_value = {}, {}
        for field in schema["fields"]:
            if "default" in field and rnd.random() < 0.5:
                continue
            field_type = field["type"]
            if "cdc.encoding" in field and isinstance(field_type, dict) and field_type.get("type") == "map":
                field_type = {
                    **field_type,
                    "values": {
                        **named.get(field_type["values"]["name"], field_type["values"]),
                        "cdc.encoding": field["cdc.encoding"],
                    },
                }
            json_value[field["name"]], py_value[field["name"]] = random_value(field_type, rnd, named)
        return json_value, py_value
    return random_value(kind, rnd, named)  # {"type": "long", "logicalType": ...}


@pytest.fixture(scope="module")
def kitchen(tmp_path_factory: pytest.TempPathFactory) -> AvroEncoder:
    root = tmp_path_factory.mktemp("schemas")
    write_schema(root, "Kitchen", 1, KITCHEN)
    write_schema(root, "LogicalKitchen", 1, LOGICAL_KITCHEN)
    return AvroEncoder(SchemaStore(root))


@pytest.mark.parametrize("seed", range(300))
@pytest.mark.parametrize("schema", [KITCHEN, LOGICAL_KITCHEN], ids=["plain", "logical"])
def test_byte_for_byte_equal_to_fastavro_on_random_payloads(
    kitchen: AvroEncoder, schema: dict[str, Any], seed: int
) -> None:
    encoder, parsed = kitchen, cast(dict[str, Any], parse_schema(schema))
    json_value, py_value = random_value(parsed, random.Random(seed), parsed["__named_schemas"])
    name = schema["name"]
    assert encoder.encode_body(name, 1, orjson.dumps(json_value)) == fastavro_body(parsed, py_value)


def test_varint_edges_equal_fastavro(tmp_path: Path) -> None:
    schema = record("L", ("l", "long"), ("i", "int"))
    write_schema(tmp_path, "L", 1, schema)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    for value in EDGE_INTS:
        small = max(-(2**31), min(2**31 - 1, value))
        payload = {"l": value, "i": small}
        assert encoder.encode_body("L", 1, orjson.dumps(payload)) == fastavro_body(
            parse_schema(schema), payload
        )


def test_large_arrays_strings_and_maps_equal_fastavro(tmp_path: Path) -> None:
    schema = record(
        "Big",
        ("a", {"type": "array", "items": "int"}),
        ("s", "string"),
        ("m", {"type": "map", "values": "boolean"}),
    )
    write_schema(tmp_path, "Big", 1, schema)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    for n in (0, 63, 64, 8191, 8192, 20000):
        value = {"a": list(range(n)), "s": "é" * n, "m": {str(i): i % 2 == 0 for i in range(n)}}
        assert encoder.encode_body("Big", 1, orjson.dumps(value)) == fastavro_body(
            parse_schema(schema), value
        )


def test_union_branch_choice_equals_fastavro(tmp_path: Path) -> None:
    schema = record("U", ("u", ["null", "int", "long", "double", "string"]), ("n", ["int", "null"]))
    write_schema(tmp_path, "U", 1, schema)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    for u in (None, 0, 2**31 - 1, 2**31, -(2**63), 1.5, "x"):
        for n in (None, 7):
            value = {"u": u, "n": n}
            assert encoder.encode_body("U", 1, orjson.dumps(value)) == fastavro_body(
                parse_schema(schema), value
            )


def test_recursive_schema(tmp_path: Path) -> None:
    schema = record(
        "Node",
        ("value", "int"),
        ("next", ["null", "t.Node"]),
        ("kids", {"type": "array", "items": "t.Node"}),
        next=None,
        kids=[],
    )
    write_schema(tmp_path, "Node", 1, schema)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    value = {"value": 1, "next": {"value": 2, "next": {"value": 3, "kids": [{"value": 4}]}}}
    full = {
        "value": 1,
        "kids": [],
        "next": {
            "value": 2,
            "kids": [],
            "next": {"value": 3, "next": None, "kids": [{"value": 4, "next": None, "kids": []}]},
        },
    }
    assert encoder.encode_body("Node", 1, orjson.dumps(value)) == fastavro_body(parse_schema(schema), full)
    bad = {"value": 1, "next": {"value": 2, "next": {"value": 3, "kids": [{"value": "4"}]}}}
    with pytest.raises(
        PayloadInvalidError, match=r"field 'next\.next\.kids\[0\]\.value' expects int, got string"
    ):
        encoder.encode("Node", 1, orjson.dumps(bad))
    for depth in (5000, 1000):  # beyond orjson's depth limit; within it, but beyond Python's recursion limit
        with pytest.raises(PayloadInvalidError):
            encoder.encode("Node", 1, '{"value": 0, "next": ' * depth + '{"value": 0}' + "}" * depth)
    chain = '{"value": 0, "next": ' * 200 + '{"value": 0}' + "}" * 200
    assert encoder.encode_body("Node", 1, chain) == b"\x00\x02" * 200 + b"\x00\x00\x00" + b"\x00" * 200


def test_deeply_nested_schema_compiles(tmp_path: Path) -> None:
    inner: Any = ["null", "int"]
    value: Any = 5
    for i in range(25):
        inner, value = {"type": "array", "items": inner}, [value, None] if i == 0 else [value, []]
    schema = record("Deep", ("d", inner))
    write_schema(tmp_path, "Deep", 1, schema)
    encoder = AvroEncoder(SchemaStore(tmp_path))
    assert encoder.encode_body("Deep", 1, orjson.dumps({"d": value})) == fastavro_body(
        parse_schema(schema), {"d": value}
    )


def test_float_is_written_as_single_precision(tmp_path: Path) -> None:
    write_schema(tmp_path, "F", 1, record("F", ("f", "float"), ("d", "double")))
    body = AvroEncoder(SchemaStore(tmp_path)).encode_body("F", 1, b'{"f": 0.1, "d": 3}')
    assert body == struct.pack("<f", 0.1) + struct.pack("<d", 3.0)


# --- schema files are data, never code ----------------------------------------------------------------------


def quoteless(text: str) -> str:
    """A Python expression for ``text`` without quotes: it survives being pasted into a string literal."""
    return "+".join(f"chr({ord(c)})" for c in text)


def test_a_fixed_size_that_is_python_code_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"(open({quoteless(str(marker))}, {quoteless('w')}).close() or 0)"
    evil = record("Evil", ("f", {"type": "fixed", "name": "F", "size": code}), f="")
    path = write_schema(tmp_path / "schemas", "Evil", 1, evil)
    encoder = AvroEncoder(SchemaStore(tmp_path / "schemas"))
    refused: SchemaNotFoundError | None = None
    try:
        encoder.encode("Evil", 1, b'{"f": ""}')
    except SchemaNotFoundError as exc:
        refused = exc
    assert not marker.exists(), "the schema file ran code"
    assert refused is not None, "the schema was accepted"
    assert str(path) in str(refused) and "fields[0].type.size" in str(refused)
    assert "open" not in str(refused), "the attribute's text is not repeated"
    report = check_schemas(tmp_path / "schemas", "BACKWARD")  # the deploy gate CI runs on pull requests
    assert not marker.exists(), "cdc schemas check ran code from the schema file"
    assert any("size" in problem for problem in report.problems)


FIXED = {"type": "fixed", "name": "F", "size": 2}
ENUM = {"type": "enum", "name": "E", "symbols": ["A", "B"]}


@pytest.mark.parametrize(
    ("schema", "attribute"),
    [
        (record("Bad", ("f", {**FIXED, "size": "2"})), "fields[0].type.size"),
        (record("Bad", ("f", {**FIXED, "size": -1})), "fields[0].type.size"),
        (record("Bad", ("f", {**FIXED, "size": True})), "fields[0].type.size"),
        (record("Bad", ("f", {**FIXED, "size": 2.0})), "fields[0].type.size"),
        (record("Bad", ("f')] or x[('", "int")), "fields[0].name"),
        (record("Bad", ("ok", "int"), (3, "int")), "fields[1].name"),  # type: ignore[arg-type]
        (record("Bad", ("ok", "int"), ("ok", "long")), "fields[1].name"),
        (record("Bad", ("r", record("In'ner", ("a", "int")))), "fields[0].type.name"),
        (record("Bad", ("r", {**record("Inner", ("a", "int")), "namespace": "t x"})), "fields[0].type.name"),
        (record("Bad", ("e", {**ENUM, "symbols": "AB"})), "fields[0].type.symbols"),
        (record("Bad", ("e", {"type": "array", "items": {**ENUM, "symbols": "AB"}})), "fields[0].type.items"),
        (
            record("Bad", ("m", {"type": "map", "values": {**FIXED, "size": "2"}})),
            "fields[0].type.values.size",
        ),
        (record("Bad", ("u", ["null", {**FIXED, "size": "2"}])), "fields[0].type[1].size"),
    ],
    ids=[
        "size-string",
        "size-negative",
        "size-bool",
        "size-float",
        "field-name-quote",
        "field-name-int",
        "field-name-twice",
        "record-name-quote",
        "namespace-space",
        "symbols-string",
        "array-items",
        "map-values",
        "union-branch",
    ],
)
def test_an_attribute_of_the_wrong_type_is_an_invalid_schema(
    tmp_path: Path, schema: dict[str, Any], attribute: str
) -> None:
    path = write_schema(tmp_path, "Bad", 1, schema)
    with pytest.raises(SchemaNotFoundError, match="is not valid Avro") as info:
        AvroEncoder(SchemaStore(tmp_path)).encoder_for("Bad", 1)
    assert str(path) in str(info.value) and "Bad v1" in str(info.value)
    assert attribute in str(info.value)


def test_defaults_and_symbols_that_look_like_code_are_only_data(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    sneaky = f"'); open({str(marker)!r}, 'w') #\"\"\"\\"
    schema = record(
        "Fine",
        ("s", "string"),
        ("raw", "bytes"),
        ("fix", {"type": "fixed", "name": "Twelve", "size": 12}),
        ("e", {"type": "enum", "name": "E", "symbols": ["A_1", "_b"]}),
        ("m", {"type": "map", "values": "string"}),
        s=sneaky,
        raw="\u00ff'\"",
        fix='\')#"""\\\n\r\t\x00x',
        e="_b",
        m={sneaky: sneaky},
    )
    write_schema(tmp_path, "Fine", 1, schema)
    body = AvroEncoder(SchemaStore(tmp_path)).encode_body("Fine", 1, b"{}")
    expected = {**{f["name"]: f["default"] for f in schema["fields"]}}
    expected["raw"], expected["fix"] = expected["raw"].encode("latin-1"), expected["fix"].encode("latin-1")
    assert body == fastavro_body(parse_schema(schema), expected)
    assert not marker.exists()
