"""Payloads as applications write them, through a real `cdc run` into Kafka, read back by Apache Avro's Java
code with its logical-type conversions (tests/java/avro-decode) in both framings, and by EventDeserializer.

Three producers write the same values: an outbox row built by jsonb_build_object from typed columns (numeric,
timestamptz, timestamp, date, time, uuid, bytea: no conversion code, but for the two fields that show the
decimal-string and base64 forms), cdc.outbox.emit with Python values, and the outbox_emit_message function
(a logical message, whose decimals must come from the digits written too). Then the payload errors: each
goes to the dead-letter topic as payload_invalid with the field, what was expected and what came.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc.consumer import EventDeserializer
from cdc.outbox import emit
from tests.integration.test_framing import AsMessage
from tests.plugins.pipeline import SCHEMAS_DIR
from tests.plugins.registry import registry_ca

UTC = dt.UTC


def decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def logical(avro_type: str, name: str) -> dict[str, Any]:
    return {"type": avro_type, "logicalType": name}


FIELDS: list[dict[str, Any]] = [
    {"name": "amount", "type": decimal(10, 2)},
    {"name": "big", "type": decimal(38, 10)},
    {
        "name": "cents",
        "type": {
            "type": "fixed",
            "name": "Cents",
            "size": 9,
            "logicalType": "decimal",
            "precision": 20,
            "scale": 3,
        },
    },
    {"name": "price", "type": decimal(12, 4)},  # written as a decimal string
    {"name": "at", "type": logical("long", "timestamp-micros")},
    {"name": "at_ms", "type": logical("long", "timestamp-millis")},
    {"name": "epoch_ms", "type": logical("long", "timestamp-millis")},  # an integer, as before
    {"name": "local", "type": logical("long", "local-timestamp-micros")},
    {"name": "local_ms", "type": logical("long", "local-timestamp-millis")},
    {"name": "day", "type": logical("int", "date")},
    {"name": "t", "type": logical("long", "time-micros")},
    {"name": "t_ms", "type": logical("int", "time-millis")},
    {"name": "id", "type": logical("string", "uuid")},
    {"name": "uid", "type": {"type": "fixed", "name": "Uid", "size": 16, "logicalType": "uuid"}},
    {"name": "digest", "type": {"type": "fixed", "name": "Sha256", "size": 32}, "cdc.encoding": "hex"},
    {"name": "raw", "type": "bytes", "cdc.encoding": "hex"},  # a bytea column as jsonb_build_object writes it
    {"name": "blob", "type": "bytes", "cdc.encoding": "base64"},  # encode(data, 'base64')
]
SCHEMA = {"type": "record", "name": "Payment", "namespace": "outbox.events", "fields": FIELDS}
SCALES = {"amount": 2, "big": 10, "cents": 3, "price": 4}

# Typed columns; jsonb_build_object makes the payload. Time zone Asia/Kolkata: offsets of +05:30, and of
# +05:53:28 in 1900 (local mean time), as to_jsonb(timestamptz) writes them.
SOURCE = """CREATE TEMP TABLE payment_source (
    n int, event_id uuid, amount numeric(10,2), big numeric(38,10), cents numeric(20,3), price numeric(12,4),
    at timestamptz, at_ms timestamptz(3), local timestamp, local_ms timestamp(3), day date, t time,
    t_ms time(3), id uuid, data bytea)"""
BUILD_ARGS = """
    'amount', amount, 'big', big, 'cents', cents, 'price', price::text, 'at', at, 'at_ms', at_ms,
    'epoch_ms', (extract(epoch from at_ms) * 1000)::bigint, 'local', local, 'local_ms', local_ms, 'day', day,
    't', t, 't_ms', t_ms, 'id', id, 'uid', id, 'digest', sha256(data), 'raw', data,
    'blob', encode(data, 'base64')"""
BUILD = f"jsonb_build_object({BUILD_ARGS})"
COLUMNS = ["amount", "big", "cents", "price", "at", "at_ms", "local", "local_ms", "day", "t", "t_ms", "id"]


def rows() -> list[dict[str, Any]]:
    """The values the application means, one dict a row (zero bytes in decimals, uuids and digests)."""
    return [
        {
            "amount": Decimal("2.56"),  # 256: 01 00
            "big": Decimal("1234567890123456789012345678.1234567891"),  # beyond a double's digits
            "cents": Decimal("-12345678901234567.891"),
            "price": Decimal("655.3600"),  # 6553600: 64 00 00
            "at": dt.datetime(2026, 12, 3, 5, 41, 22, 817479, UTC),
            "at_ms": dt.datetime(2026, 12, 3, 5, 41, 22, 817000, UTC),
            "local": dt.datetime(2026, 12, 3, 5, 41, 22, 817479),
            "local_ms": dt.datetime(2026, 12, 3, 5, 41, 22, 817000),
            "day": dt.date(2026, 12, 3),
            "t": dt.time(5, 41, 22, 817479),
            "t_ms": dt.time(5, 41, 22, 817000),
            "id": uuid.UUID("00000000-0000-4000-8000-000000000000"),
            "data": bytes(range(256)) * 2,  # every byte; base64 of it has PostgreSQL's line breaks
        },
        {
            "amount": Decimal("-655.36"),
            "big": Decimal("0E-10"),
            "cents": Decimal("0.000"),
            "price": Decimal("-0.0001"),
            "at": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC),
            "at_ms": dt.datetime(1900, 1, 1, 0, 0, 0, 1000, UTC),
            "local": dt.datetime(1, 1, 1),
            "local_ms": dt.datetime(1969, 12, 31, 23, 59, 59, 999000),
            "day": dt.date(1969, 12, 31),
            "t": dt.time(0),
            "t_ms": dt.time(23, 59, 59, 999000),
            "id": uuid.UUID("f81d4fae-7dec-41d0-a765-00a0c91e6bf6"),
            "data": b"",
        },
        {
            "amount": Decimal("99999999.99"),
            "big": Decimal("-9999999999999999999999999999.9999999999"),
            "cents": Decimal("99999999999999999.999"),
            "price": Decimal("12345678.1234"),
            "at": dt.datetime(9999, 12, 30, 23, 59, 59, 999999, UTC),
            "at_ms": dt.datetime(2000, 2, 29, 12, 0, 0, 5000, UTC),
            "local": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
            "local_ms": dt.datetime(2000, 2, 29, 0, 0, 0, 1000),
            "day": dt.date(9999, 12, 31),
            "t": dt.time(23, 59, 59, 999999),
            "t_ms": dt.time(0, 0, 0, 1000),
            "id": uuid.UUID(int=1),
            "data": b"\x00",
        },
    ]


def meant(row: dict[str, Any]) -> dict[str, Any]:
    """The payload the application means by a row, as Python values."""
    values = {k: row[k] for k in COLUMNS}
    return {
        **values,
        "epoch_ms": row["at_ms"],
        "uid": row["id"],
        "digest": hashlib.sha256(row["data"]).digest(),
        "raw": row["data"],
        "blob": row["data"],
    }


def from_java(node: Any) -> Any:
    """A value of AvroDecode's output as the Python value it stands for (its class checked by the type)."""
    if not isinstance(node, dict) or "class" not in node:
        return node
    cls = node["class"]
    if cls in ("ByteBuffer", "Fixed"):
        return bytes.fromhex(node["hex"])
    text = node["text"]
    convert = {
        "BigDecimal": Decimal,
        "Instant": dt.datetime.fromisoformat,
        "LocalDateTime": dt.datetime.fromisoformat,
        "LocalDate": dt.date.fromisoformat,
        "LocalTime": dt.time.fromisoformat,
        "UUID": uuid.UUID,
    }
    assert cls in convert, f"Java read a value as {cls}: a logical type was not converted"
    return convert[cls](text)


@pytest.fixture
def payment_schemas(tmp_path: Path) -> Path:
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    (schemas / "Payment").mkdir()
    (schemas / "Payment" / "v1.avsc").write_text(json.dumps(SCHEMA, indent=2))
    return schemas


def write_sql_rows(outbox: Any, source: list[dict[str, Any]], *, messages: bool) -> list[str]:
    """Rows of typed columns, then outbox rows (or outbox messages) built from them by jsonb_build_object."""
    ids = [str(uuid.uuid4()) for _ in source]
    function = sql.Identifier(outbox.settings.table.schema, f"{outbox.table}_emit_message")
    with psycopg.connect(outbox.dsn) as conn:
        conn.execute("SET TIME ZONE 'Asia/Kolkata'")
        conn.execute(SOURCE)
        conn.cursor().executemany(
            "INSERT INTO payment_source VALUES (" + ", ".join(["%s"] * 15) + ")",
            [
                (n, i, *(r[k] for k in COLUMNS), r["data"])
                for n, (i, r) in enumerate(zip(ids, source, strict=True))
            ],
        )
        if messages:
            query = sql.SQL(
                "SELECT {}('payment', 'm-' || n, 'Payment', "
                + BUILD
                + ", 1, NULL, event_id) FROM payment_source"
                " ORDER BY n"
            ).format(function)
        else:
            query = sql.SQL(
                "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
                " SELECT event_id, 'payment', 'r-' || n, 'Payment', 1, "
                + BUILD
                + " FROM payment_source ORDER BY n"
            ).format(sql.Identifier(outbox.table))
        conn.execute(query)
    return ids


def emit_rows(outbox: Any, schemas: Path, source: list[dict[str, Any]]) -> list[str]:
    """The same values through cdc.outbox.emit, as Python values: no conversion by the application."""
    ids = []
    with psycopg.connect(outbox.dsn) as conn:
        for n, row in enumerate(source):
            epoch_ms = (row["at_ms"] - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(milliseconds=1)
            payload = {**meant(row), "epoch_ms": epoch_ms}
            payload["blob"], payload["raw"] = bytearray(row["data"]), memoryview(row["data"])
            event_id = emit(
                conn,
                aggregate_type="payment",
                aggregate_id=f"e-{n}",
                event_type="Payment",
                payload=payload,
                schemas=schemas,
                table=outbox.settings.table,
                columns=outbox.settings.columns,
            )
            ids.append(str(event_id))
    return ids


@pytest.mark.parametrize(
    "value_format",
    [
        "single-object",
        pytest.param(
            "confluent",
            marks=pytest.mark.plain("the Java decoder fetches schemas from the registry without its CA"),
        ),
    ],
)
def test_jsonb_build_object_emit_and_messages_arrive_as_java_reads_them(
    outbox, pipeline_process, consume, avro_java, payment_schemas, pg_major, value_format, request
):
    registry = request.getfixturevalue("schema_registry_url") if value_format == "confluent" else None
    env = {"CDC_SCHEMAS_DIR": str(payment_schemas), "CDC_VALUE_FORMAT": value_format}
    proc = pipeline_process(**env, **({"CDC_SCHEMA_REGISTRY_URL": registry} if registry else {}))
    proc.wait_streaming()
    source = rows()
    expected: dict[str, dict[str, Any]] = {}
    for ids in (
        write_sql_rows(outbox, source, messages=False),
        emit_rows(outbox, payment_schemas, source),
        *([write_sql_rows(outbox, source, messages=True)] if pg_major >= 14 else []),
    ):
        expected |= {i: meant(row) for i, row in zip(ids, source, strict=True)}
    records = consume(outbox.topic("payment"), len(expected), timeout=90)
    assert {r.headers["id"].decode() for r in records} == set(expected)
    assert outbox.dlq_topic not in [r.topic for r in records]
    decoded = avro_java.decode([r.value for r in records], payment_schemas, registry)
    for record, java in zip(records, decoded, strict=True):
        assert "error" not in java, java
        assert (java["framing"], java["schema"]) == (value_format, "outbox.events.Payment")
        got = {k: from_java(v) for k, v in java["value"].items()}
        assert got == expected[record.headers["id"].decode()], record.headers["id"]
        for name, scale in SCALES.items():
            assert Decimal(java["value"][name]["text"]).as_tuple().exponent == -scale, name
    with EventDeserializer(
        payment_schemas, schema_registry_url=registry, schema_registry_ca_file=registry_ca(registry)
    ) as deserializer:
        for record in records:
            event = deserializer(AsMessage(record))
            assert event.payload == expected[event.id]
            assert type(event.payload["uid"]) is uuid.UUID and type(event.payload["amount"]) is Decimal
    assert proc.terminate() == 0


BAD = [
    # (SQL for the payload, from a row of the first of rows(); the field; what the message says)
    (
        "'amount', 2.561",
        "amount",
        "expects decimal(10,2), got number with more than 2 digits after the point",
    ),
    ("'amount', 123456789.5", "amount", "expects decimal(10,2), got number of more than 10 digits"),
    ("'price', 's3cr3t-12.5'", "price", "expects decimal(12,4), got string that is not a decimal number"),
    ("'price', 'NaN'::numeric", "price", "expects decimal(12,4), got NaN or Infinity"),
    ("'at_ms', at", "at_ms", "expects timestamp-millis, got a value more precise than milliseconds"),
    ("'at', local", "at", "expects timestamp-micros, got a date-time without a UTC offset"),
    ("'local', at", "local", "expects local-timestamp-micros, got a date-time with a UTC offset"),
    ("'t', t::timetz", "t", "expects time-micros, got a time with a UTC offset"),
    ("'day', at", "day", "expects date, got string that is not a date YYYY-MM-DD"),
    ("'uid', 'nope'", "uid", "expects uuid, got string that is not a UUID"),
    ("'blob', data", "blob", "expects bytes (base64), got string that is not base64"),
    (
        "'digest', encode(sha256(data), 'base64')",
        "digest",
        "expects fixed Sha256 (hex), got string that is not hex",
    ),
]


def test_payload_errors_are_dead_letters_that_name_the_field_and_never_the_value(
    outbox, pipeline_process, consume, payment_schemas
):
    proc = pipeline_process(CDC_SCHEMAS_DIR=str(payment_schemas))
    proc.wait_streaming()
    ids = [str(uuid.uuid4()) for _ in range(len(BAD) + 1)]
    with psycopg.connect(outbox.dsn) as conn:
        conn.execute(SOURCE)
        row = rows()[0]
        conn.execute(
            "INSERT INTO payment_source VALUES (" + ", ".join(["%s"] * 15) + ")",
            (0, ids[0], *(row[k] for k in COLUMNS), row["data"]),
        )
        # jsonb_build_object keeps the last of two equal keys: each bad event is the good one with one field
        # replaced; the last event is the good one, which must arrive after them.
        for event_id, change in zip(ids, [*(b[0] for b in BAD), None], strict=True):
            payload = f"jsonb_build_object({BUILD_ARGS}{', ' + change if change else ''})"
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
                    " SELECT %s, 'payment', 'p-1', 'Payment', 1, " + payload + " FROM payment_source"
                ).format(sql.Identifier(outbox.table)),
                (event_id,),
            )
    dead = consume(outbox.dlq_topic, len(BAD), timeout=60)
    by_id = {r.headers["id"].decode(): r for r in dead}
    for event_id, (_, field, problem) in zip(ids[:-1], BAD, strict=True):
        headers = by_id[event_id].headers
        assert headers["error_reason"] == b"payload_invalid"
        message = headers["error_message"].decode()
        assert message.startswith(f"Payment v1: field '{field}' {problem}"), message
        assert "s3cr3t" not in message
    arrived = consume(outbox.topic("payment"), 1, timeout=60)
    assert arrived[0].headers["id"].decode() == ids[-1]
    assert proc.terminate() == 0
    assert "s3cr3t" not in proc.log()
