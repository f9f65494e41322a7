"""The JSON forms of logical types and bytes (cdc.avro.logical through the compiled encoders): each form
written byte for byte as fastavro writes the Python value it stands for, and each error named clearly."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastavro import parse_schema

from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import SchemaStore
from cdc.errors import PayloadInvalidError, SchemaNotFoundError
from tests.unit.avro.test_encoder import SECRET, decode, fastavro_body, record, write_schema

UTC = dt.UTC


def decimal(precision: int, scale: int, **extra: Any) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale, **extra}


def fixed_decimal(size: int, precision: int, scale: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "fixed",
        "name": f"D{size}",
        "size": size,
        "logicalType": "decimal",
        "precision": precision,
        "scale": scale,
        **extra,
    }


def logical(avro_type: str, name: str) -> dict[str, Any]:
    return {"type": avro_type, "logicalType": name}


UUID_FIXED = {"type": "fixed", "name": "Uuid", "size": 16, "logicalType": "uuid"}
HASH = {"type": "fixed", "name": "Hash", "size": 4}
MONEY = decimal(10, 2)
TS_MS, TS_US = logical("long", "timestamp-millis"), logical("long", "timestamp-micros")
LOCAL_MS, LOCAL_US = logical("long", "local-timestamp-millis"), logical("long", "local-timestamp-micros")
DATE, TIME_MS, TIME_US = logical("int", "date"), logical("int", "time-millis"), logical("long", "time-micros")
UUID = logical("string", "uuid")
PG_NOW = "2026-12-03T05:41:22.817479+00:00"  # to_jsonb(now()), as the issue quotes it
PG_BYTES = bytes(range(256)) * 2  # every byte, zeros included; PostgreSQL's base64 breaks its lines


def encoder_for(tmp_path: Path, field_type: Any, **field: Any) -> tuple[AvroEncoder, Any]:
    schema = record("R", ("v", field_type))
    schema["fields"][0].update(field)
    write_schema(tmp_path, "R", 1, schema)
    return AvroEncoder(SchemaStore(tmp_path)), parse_schema(schema)


def body(encoder: AvroEncoder, json_value: str | bytes) -> bytes:
    text = json_value if isinstance(json_value, bytes) else json_value.encode()
    return encoder.encode_body("R", 1, b'{"v": ' + text + b"}")


def pg_base64(raw: bytes) -> str:
    """What PostgreSQL's encode(raw, 'base64') returns: a line break every 76 characters."""
    text = base64.b64encode(raw).decode()
    return "\n".join(text[i : i + 76] for i in range(0, len(text), 76))


ACCEPTED = [
    # decimal: a JSON number, exact, scaled; values with a zero byte (256 = 01 00, 65536 = 01 00 00)
    (MONEY, {}, "2.56", Decimal("2.56")),
    (MONEY, {}, "655.36", Decimal("655.36")),
    (MONEY, {}, "-2.56", Decimal("-2.56")),
    (MONEY, {}, "0", Decimal("0.00")),
    (MONEY, {}, "12", Decimal("12.00")),
    (MONEY, {}, "12.340", Decimal("12.34")),  # zeros beyond the scale lose nothing
    (MONEY, {}, "1E+2", Decimal("100.00")),
    (MONEY, {}, "99999999.99", Decimal("99999999.99")),
    (MONEY, {}, "-99999999.99", Decimal("-99999999.99")),
    (MONEY, {}, "1.28", Decimal("1.28")),  # 128: 00 80
    # ... or a decimal string
    (MONEY, {}, '"12.3"', Decimal("12.30")),
    (MONEY, {}, '"-0.5"', Decimal("-0.50")),
    (MONEY, {}, '"+7"', Decimal("7.00")),
    (MONEY, {}, '"1.5E+3"', Decimal("1500.00")),
    # beyond a double's 15-17 digits: never through a float
    (
        decimal(38, 10),
        {},
        "1234567890123456789012345678.1234567891",
        Decimal("1234567890123456789012345678.1234567891"),
    ),
    (decimal(30, 28), {}, "0.1000000000000000000000000001", Decimal("0.1000000000000000000000000001")),
    (
        decimal(38, 0),
        {},
        "12345678901234567890123456789012345678",
        Decimal("12345678901234567890123456789012345678"),
    ),
    (fixed_decimal(9, 20, 3), {}, "-12345678901234567.891", Decimal("-12345678901234567.891")),
    (fixed_decimal(9, 20, 3), {}, "2.56", Decimal("2.560")),
    (fixed_decimal(2, 4, 2), {}, '"-0.01"', Decimal("-0.01")),
    # the bytes form stays, in the field's encoding: 01 00 is 2.56
    (MONEY, {"cdc.encoding": "base64"}, '"AQA="', Decimal("2.56")),
    (MONEY, {"cdc.encoding": "hex"}, '"\\\\x0100"', Decimal("2.56")),
    (MONEY, {"cdc.encoding": "latin1"}, '"\\u0001\\u00ff"', Decimal("5.11")),
    (MONEY, {"cdc.encoding": "base64"}, "2.56", Decimal("2.56")),  # a number is a number
    (fixed_decimal(2, 4, 2, **{"cdc.encoding": "base64"}), {}, '"AQA="', Decimal("2.56")),
    # timestamps: integers as before, and ISO-8601 with an offset as to_jsonb(timestamptz) writes it
    (TS_US, {}, "1764740482817479", dt.datetime(2025, 12, 3, 5, 41, 22, 817479, UTC)),
    (TS_US, {}, f'"{PG_NOW}"', dt.datetime(2026, 12, 3, 5, 41, 22, 817479, UTC)),
    (TS_US, {}, '"2026-12-03 07:41:22.817479+02"', dt.datetime(2026, 12, 3, 5, 41, 22, 817479, UTC)),
    (TS_US, {}, '"2026-12-03T11:11:22.5+05:30"', dt.datetime(2026, 12, 3, 5, 41, 22, 500000, UTC)),
    (TS_US, {}, '"2026-12-03T05:41:22Z"', dt.datetime(2026, 12, 3, 5, 41, 22, 0, UTC)),
    (
        TS_US,
        {},
        '"1900-01-01T00:19:32+00:19:32"',
        dt.datetime(1900, 1, 1, 0, 0, 0, 0, UTC),
    ),  # PostgreSQL's LMT
    (TS_US, {}, '"1969-12-31T23:59:59.999999-00:00"', dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC)),
    (TS_US, {}, '"0001-01-01T00:00:00+00:00"', dt.datetime(1, 1, 1, tzinfo=UTC)),
    (TS_US, {}, '"9999-12-31T23:59:59.999999+00:00"', dt.datetime(9999, 12, 31, 23, 59, 59, 999999, UTC)),
    (TS_MS, {}, '"2026-12-03T05:41:22.817+00:00"', dt.datetime(2026, 12, 3, 5, 41, 22, 817000, UTC)),
    (TS_MS, {}, '"2026-12-03T05:41:22.817000+00:00"', dt.datetime(2026, 12, 3, 5, 41, 22, 817000, UTC)),
    (TS_MS, {}, "-1", dt.datetime(1969, 12, 31, 23, 59, 59, 999000, UTC)),
    (LOCAL_US, {}, '"2026-12-03T05:41:22.817479"', dt.datetime(2026, 12, 3, 5, 41, 22, 817479)),
    (LOCAL_MS, {}, '"2026-12-03 05:41:22.8"', dt.datetime(2026, 12, 3, 5, 41, 22, 800000)),
    (DATE, {}, '"2026-12-03"', dt.date(2026, 12, 3)),
    (DATE, {}, '"1969-12-31"', dt.date(1969, 12, 31)),
    (DATE, {}, "20425", dt.date(2025, 12, 3)),
    (TIME_MS, {}, '"05:41:22.817"', dt.time(5, 41, 22, 817000)),
    (TIME_US, {}, '"05:41:22.817479"', dt.time(5, 41, 22, 817479)),
    (TIME_US, {}, '"00:00:00"', dt.time(0)),
    (TIME_US, {}, '"23:59:59.999999"', dt.time(23, 59, 59, 999999)),
    (TIME_MS, {}, "1000", dt.time(0, 0, 1)),
    # uuid: a string as before (now checked); on a fixed(16), the string or 16 bytes
    (UUID, {}, '"0d5c0b0e-0000-4000-8000-00000000000A"', "0d5c0b0e-0000-4000-8000-00000000000A"),
    (UUID_FIXED, {}, '"00000000-0000-0000-0000-0000000000ff"', (255).to_bytes(16, "big")),
    (UUID_FIXED, {"cdc.encoding": "base64"}, f'"{base64.b64encode(bytes(16)).decode()}"', bytes(16)),
    (UUID_FIXED, {}, '"abcdefghijklmnop"', b"abcdefghijklmnop"),
    # bytes and fixed in base64 (PostgreSQL's line breaks) or hex (a bytea column's own text)
    ("bytes", {"cdc.encoding": "base64"}, orjson.dumps(pg_base64(PG_BYTES)).decode(), PG_BYTES),
    ("bytes", {"cdc.encoding": "base64"}, '""', b""),
    ("bytes", {"cdc.encoding": "hex"}, '"\\\\x00ff10"', b"\x00\xff\x10"),
    ("bytes", {"cdc.encoding": "hex"}, '"00FF10"', b"\x00\xff\x10"),
    ("bytes", {"cdc.encoding": "hex"}, '"\\\\x"', b""),
    ("bytes", {"cdc.encoding": "latin1"}, '"\\u00ff"', b"\xff"),
    (HASH, {"cdc.encoding": "base64"}, '"AAECAw=="', b"\x00\x01\x02\x03"),
    ({**HASH, "cdc.encoding": "hex"}, {}, '"00010203"', b"\x00\x01\x02\x03"),
    (
        {**HASH, "cdc.encoding": "hex"},
        {"cdc.encoding": "base64"},
        '"00010203"',
        b"\x00\x01\x02\x03",
    ),  # own wins
    # a field's encoding holds for the bytes inside it
    ({"type": "array", "items": "bytes"}, {"cdc.encoding": "base64"}, '["AA==", "/w=="]', [b"\x00", b"\xff"]),
    ({"type": "map", "values": "bytes"}, {"cdc.encoding": "hex"}, '{"a": "00"}', {"a": b"\x00"}),
    (["null", "bytes"], {"cdc.encoding": "base64"}, '"AA=="', b"\x00"),
    (["null", MONEY], {}, "2.56", Decimal("2.56")),
    (["null", MONEY], {}, '"2.56"', Decimal("2.56")),
    (["null", TS_MS], {}, '"2026-12-03T05:41:22.817Z"', dt.datetime(2026, 12, 3, 5, 41, 22, 817000, UTC)),
    (["null", TS_MS], {}, "0", dt.datetime(1970, 1, 1, tzinfo=UTC)),
    # a logical type on another type is that type, as the specification says
    (logical("string", "timestamp-millis"), {}, '"yesterday"', "yesterday"),
    ({"type": "fixed", "name": "F8", "size": 8, "logicalType": "uuid"}, {}, '"abcdefgh"', b"abcdefgh"),
]


@pytest.mark.parametrize(("field_type", "field", "json_value", "meant"), ACCEPTED)
def test_each_form_is_written_as_fastavro_writes_the_value_it_means(
    tmp_path: Path, field_type: Any, field: dict[str, Any], json_value: str, meant: Any
) -> None:
    encoder, schema = encoder_for(tmp_path, field_type, **field)
    assert body(encoder, json_value) == fastavro_body(schema, {"v": meant})


def test_decimal_bytes_are_as_short_as_javas_biginteger_writes_them(tmp_path: Path) -> None:
    """fastavro writes -128 as ff 80; Java's BigInteger.toByteArray, and this encoder, as 80."""
    encoder, schema = encoder_for(tmp_path, MONEY)
    for text, raw in (("-1.28", b"\x80"), ("1.28", b"\x00\x80"), ("-1.29", b"\xff\x7f"), ("0", b"\x00")):
        assert body(encoder, text) == bytes([len(raw) << 1]) + raw
        assert decode(schema, body(encoder, text))["v"] == Decimal(text).quantize(Decimal("0.01"))


def test_a_schema_with_a_decimal_reads_its_numbers_exactly_and_others_do_not(tmp_path: Path) -> None:
    write_schema(tmp_path, "Exact", 1, record("Exact", ("m", MONEY), ("d", "double"), ("i", "int")))
    write_schema(tmp_path, "Fast", 1, record("Fast", ("t", TS_MS), ("d", "double")))
    encoder = AvroEncoder(SchemaStore(tmp_path))
    assert encoder.reads_exactly("Exact", 1) and not encoder.reads_exactly("Fast", 1)
    assert not encoder.reads_exactly("Missing", 1)
    out = encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": 0.1, "i": 7}')
    assert decode(parse_schema(record("Exact", ("m", MONEY), ("d", "double"), ("i", "int"))), out) == {
        "m": Decimal("0.10"),
        "d": 0.1,
        "i": 7,
    }
    with pytest.raises(PayloadInvalidError, match="field 'i' expects int, got number$"):
        encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": 0.1, "i": 7.0}')
    with pytest.raises(PayloadInvalidError, match="field 'd' expects double, got number out of range$"):
        encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": 1e400, "i": 7}')
    with pytest.raises(PayloadInvalidError, match="field 'i' expects int, got integer out of range$"):
        encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": 1, "i": 123456789012345678901234567890}')
    with pytest.raises(PayloadInvalidError, match="payload is not valid JSON: NaN is not a JSON value"):
        encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": NaN, "i": 7}')
    with pytest.raises(PayloadInvalidError, match="payload is not valid UTF-8$"):
        encoder.encode_body("Exact", 1, b'{"m": 0.1, "d": 1, "i": 7, "\xff": 1}')
    write_schema(tmp_path, "Text", 1, record("Text", ("m", MONEY), ("s", "string")))
    with pytest.raises(PayloadInvalidError, match="payload has a string that is not Unicode$"):
        encoder.encode_body("Text", 1, b'{"m": 0.1, "s": "\\ud800"}')


REFUSED = [
    (
        MONEY,
        {},
        "2.561",
        "expects decimal(10,2), got number with more than 2 digits after the point (it is never rounded)",
    ),
    (MONEY, {}, '"0.001"', "expects decimal(10,2), got string with more than 2 digits after the point"),
    (MONEY, {}, "123456789.1", "expects decimal(10,2), got number of more than 10 digits"),
    (MONEY, {}, "123456789", "expects decimal(10,2), got number of more than 10 digits"),
    (MONEY, {}, "1e999999999", "expects decimal(10,2), got number of more than 10 digits"),
    (MONEY, {}, "1e-999999999", "got number with more than 2 digits after the point"),
    (
        MONEY,
        {},
        '"12,34"',
        "expects decimal(10,2), got string that is not a decimal number (-123.45, 1.5E+3)",
    ),
    (MONEY, {}, '"NaN"', "expects decimal(10,2), got NaN or Infinity, which a decimal cannot hold"),
    (MONEY, {}, '"-Infinity"', "got NaN or Infinity"),
    (MONEY, {}, "true", "expects decimal(10,2), got boolean"),
    (MONEY, {}, "[1]", "expects decimal(10,2), got array"),
    (MONEY, {"cdc.encoding": "base64"}, '""', "got no bytes (two's complement takes one at least)"),
    (MONEY, {"cdc.encoding": "base64"}, '"O5rKAAE="', "got bytes of a number of more than 10 digits"),
    (MONEY, {"cdc.encoding": "base64"}, '"2.56"', "got string that is not base64"),
    (fixed_decimal(2, 4, 2), {}, '"100.00"', "expects decimal(4,2), got string of more than 4 digits"),
    (
        fixed_decimal(2, 4, 2, **{"cdc.encoding": "hex"}),
        {},
        '"000100"',
        "expects decimal(4,2) of 2 bytes, got another length",
    ),
    (
        TS_US,
        {},
        '"2026-12-03T05:41:22.817479"',
        "expects timestamp-micros, got a date-time without a UTC offset: an instant needs one",
    ),
    (
        TS_MS,
        {},
        f'"{PG_NOW}"',
        "expects timestamp-millis, got a value more precise than milliseconds (it is never truncated)",
    ),
    (TS_US, {}, '"2026-12-03T05:41:22.8174791Z"', "more precise than microseconds"),
    (TS_US, {}, '"yesterday"', "expects timestamp-micros, got string that is not an ISO-8601 date-time"),
    (TS_US, {}, '"infinity"', "got string that is not an ISO-8601 date-time"),
    (TS_US, {}, '"2026-02-30T00:00:00Z"', "got a date that does not exist"),
    (TS_US, {}, '"2026-12-03T24:00:00Z"', "got a time of day that does not exist"),
    (TS_US, {}, '"2026-12-03T23:59:60Z"', "got a time of day that does not exist"),
    (TS_US, {}, '"2026-12-03T05:41:22+05:60"', "got a UTC offset that does not exist"),
    (TS_US, {}, '"10000-01-01T00:00:00Z"', "not an ISO-8601 date-time"),
    (TS_US, {}, "1.5", "expects timestamp-micros, got number"),
    (
        LOCAL_US,
        {},
        f'"{PG_NOW}"',
        "expects local-timestamp-micros, got a date-time with a UTC offset: a local timestamp takes none",
    ),
    (LOCAL_MS, {}, '"2026-12-03T05:41:22.8174"', "more precise than milliseconds"),
    (DATE, {}, '"2026-12-03T00:00:00"', "expects date, got string that is not a date YYYY-MM-DD"),
    (DATE, {}, '"2026-13-01"', "got a date that does not exist"),
    (TIME_MS, {}, '"05:41:22.817479"', "expects time-millis, got a value more precise than milliseconds"),
    (
        TIME_US,
        {},
        '"05:41:22+02:00"',
        "expects time-micros, got a time with a UTC offset: a time of day takes none",
    ),
    (TIME_US, {}, '"24:00:00"', "got a time of day that does not exist"),
    (TIME_US, {}, '"05:41"', "expects time-micros, got string that is not a time HH:MM:SS[.ffffff]"),
    (UUID, {}, '"not-a-uuid"', "expects uuid, got string that is not a UUID (8-4-4-4-12 hex digits)"),
    (UUID, {}, '"0d5c0b0e00004000800000000000000a"', "got string that is not a UUID"),
    (
        UUID_FIXED,
        {},
        '"0d5c0b0e-0000-4000-8000"',
        "expects uuid, got string that is not a UUID (8-4-4-4-12 hex digits) nor 16 bytes in latin1",
    ),
    (
        "bytes",
        {"cdc.encoding": "base64"},
        '"AQ"',
        "expects bytes (base64), got string that is not base64 (RFC 4648, padded; line breaks allowed)",
    ),
    ("bytes", {"cdc.encoding": "base64"}, '"A Q=="', "got string that is not base64"),
    ("bytes", {"cdc.encoding": "base64"}, '"-_8="', "got string that is not base64"),
    ("bytes", {"cdc.encoding": "base64"}, '"AQ==\\u00e9"', "got string that is not base64"),
    (
        "bytes",
        {"cdc.encoding": "hex"},
        '"\\\\x0"',
        "expects bytes (hex), got string that is not hex (\\x0a1b or 0a1b, two digits a byte)",
    ),
    ("bytes", {"cdc.encoding": "hex"}, '"0g"', "got string that is not hex"),
    ("bytes", {"cdc.encoding": "hex"}, "7", "expects bytes (hex), got integer"),
    (
        HASH,
        {"cdc.encoding": "base64"},
        '"AAEC"',
        "expects fixed Hash (base64) of 4 bytes, got another length",
    ),
    (["null", MONEY], {}, "2.561", "expects null or decimal(10,2), got number with more than 2 digits"),
    (["null", TS_MS], {}, "1.5", "expects null or timestamp-millis, got number"),
]


@pytest.mark.parametrize(("field_type", "field", "json_value", "problem"), REFUSED)
def test_each_error_names_the_field_what_it_expects_and_what_came(
    tmp_path: Path, field_type: Any, field: dict[str, Any], json_value: str, problem: str
) -> None:
    encoder, _ = encoder_for(tmp_path, field_type, **field)
    with pytest.raises(PayloadInvalidError) as info:
        body(encoder, json_value)
    assert str(info.value).startswith("R v1: field 'v' expects ") and problem in str(info.value)


@pytest.mark.parametrize(
    ("field_type", "secret"),
    [
        (MONEY, f'"{SECRET}"'),
        (MONEY, "123456789.4242"),
        (TS_MS, f'"2026-12-03T05:41:22.4242424+00:00{SECRET}"'),
        (TS_MS, '"2026-12-03T05:41:22.4242424+00:00"'),
        (UUID, f'"{SECRET}"'),
        (DATE, f'"{SECRET}"'),
    ],
)
def test_errors_never_show_the_value(tmp_path: Path, field_type: Any, secret: str) -> None:
    encoder, _ = encoder_for(tmp_path, field_type)
    with pytest.raises(PayloadInvalidError) as info:
        body(encoder, secret)
    assert SECRET not in str(info.value) and "4242" not in str(info.value)


@pytest.mark.parametrize(
    "field_type",
    [
        decimal(0, 0),
        {**MONEY, "precision": "10"},
        decimal(2, 3),
        {**MONEY, "scale": 1.5},
        fixed_decimal(2, 5, 0),
        fixed_decimal(16, 39, 0),
    ],
)
def test_an_invalid_decimal_is_its_underlying_type_as_avro_says(tmp_path: Path, field_type: Any) -> None:
    """The specification (and Java): an invalid logical type is ignored, the underlying type used
    (docs/schema-checks.md). So a number is refused as it is by a plain bytes or fixed field."""
    write_schema(tmp_path, "R", 1, record("R", ("v", field_type)))
    encoder = AvroEncoder(SchemaStore(tmp_path))
    with pytest.raises(PayloadInvalidError, match=r"field 'v' expects (bytes|fixed)"):
        encoder.encode_body("R", 1, b'{"v": 1}')


@pytest.mark.parametrize(
    ("field_type", "field", "problem"),
    [
        (
            {"type": "bytes", "cdc.encoding": "base32"},
            {},
            "fields[0].type.cdc.encoding must be one of latin1, base64, hex",
        ),
        (
            {"type": "string", "cdc.encoding": "base64"},
            {},
            "fields[0].type.cdc.encoding is for bytes and fixed types, not string",
        ),
        (
            "string",
            {"cdc.encoding": "base64"},
            "fields[0].cdc.encoding is for bytes and fixed; the field holds none",
        ),
        (
            "bytes",
            {"cdc.encoding": 64},
            "fields[0].cdc.encoding must be one of latin1, base64, hex, got integer",
        ),
        (
            {"type": "array", "items": "int"},
            {"cdc.encoding": "hex"},
            "fields[0].cdc.encoding is for bytes and fixed",
        ),
    ],
)
def test_an_encoding_that_cannot_be_read_is_an_invalid_schema(
    tmp_path: Path, field_type: Any, field: dict[str, Any], problem: str
) -> None:
    schema = record("R", ("v", field_type))
    schema["fields"][0].update(field)
    write_schema(tmp_path, "R", 1, schema)
    with pytest.raises(SchemaNotFoundError, match="R v1 .* is not valid Avro: ") as info:
        AvroEncoder(SchemaStore(tmp_path)).encode_body("R", 1, b'{"v": 1}')
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "field_type",
    [
        {"type": "array", "items": "bytes"},
        ["null", {"type": "map", "values": HASH}],
        {"type": "array", "items": {"type": "array", "items": "Other"}},
    ],
)
def test_a_field_encoding_is_for_the_bytes_and_fixed_it_holds(tmp_path: Path, field_type: Any) -> None:
    schema = record("R", ("o", {"type": "fixed", "name": "Other", "size": 1}), ("v", field_type))
    schema["fields"][1]["cdc.encoding"] = "hex"
    write_schema(tmp_path, "R", 1, schema)
    AvroEncoder(SchemaStore(tmp_path)).encoder_for("R", 1)


def test_defaults_stay_avro_json_whatever_the_field_reads(tmp_path: Path) -> None:
    """A default is read as Apache Avro's Java code reads it: bytes as latin-1, a timestamp as an integer."""
    schema = record(
        "R",
        ("b", "bytes"),
        ("m", MONEY),
        ("t", TS_MS),
        ("x", "int"),
        b="\u00ff",
        m="\u0001\u0000",
        t=1000,
    )
    schema["fields"][0]["cdc.encoding"] = "base64"
    write_schema(tmp_path, "R", 1, schema)
    out = AvroEncoder(SchemaStore(tmp_path)).encode_body("R", 1, b'{"x": 1}')
    assert decode(parse_schema(schema), out) == {
        "b": b"\xff",
        "m": Decimal("2.56"),
        "t": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        "x": 1,
    }
    schema["fields"][2]["default"] = "1970-01-01T00:00:01Z"
    write_schema(tmp_path, "Q", 1, {**schema, "name": "Q"})
    with pytest.raises(SchemaNotFoundError, match=r"fields\[2\]\.default: the default does not fit"):
        AvroEncoder(SchemaStore(tmp_path)).encode_body("Q", 1, b'{"x": 1}')
