"""For the services that produce events: write an outbox row inside the caller's transaction.

``emit`` validates the payload against its schema *before* writing, so a bad event fails the application's
own transaction (where the bug is) instead of reaching the dead-letter topic. It never commits: the row is
part of whatever the caller's transaction does, which is the point of the outbox.

When an OpenTelemetry span is active, the row's ``headers`` also carry its W3C context (``traceparent``, and
``tracestate`` when set), so that the pipeline's spans and the consumer's continue the caller's trace; a
``traceparent`` (or ``tracestate``) given in ``headers`` is kept as given, and nothing is added
(:func:`cdc.trace_context.current_headers`; nothing without OpenTelemetry installed or without a
``headers`` column, as in the ``debezium`` preset).

The payload may hold ``Decimal``, ``datetime``, ``date``, ``time``, ``UUID`` and ``bytes``: they are written
in the JSON forms the pipeline reads (:mod:`cdc.avro.python_values`; bytes in their field's ``cdc.encoding``).

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...")
        emit(conn, aggregate_type="order", aggregate_id="o-1", event_type="OrderPlaced",
             payload={"order_id": "o-1", ...}, schemas=SchemaStore("schemas"))
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc.avro.encoder import AvroEncoder
from cdc.avro.python_values import payload_json
from cdc.avro.store import SchemaStore
from cdc.config import ColumnMap, TableRef
from cdc.trace_context import TRACEPARENT, TRACESTATE, current_headers

_encoders: dict[str, AvroEncoder] = {}


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits; ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant 10
    return uuid.UUID(int=value)


def _encoder(schemas: SchemaStore | str | os.PathLike[str]) -> AvroEncoder:
    store = schemas if isinstance(schemas, SchemaStore) else SchemaStore(schemas)
    key = str(store.schemas_dir.resolve())
    encoder = _encoders.get(key)
    if encoder is None:
        encoder = _encoders[key] = AvroEncoder(store)
    return encoder


def emit(
    conn: psycopg.Connection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Mapping[str, Any],
    schema_version: int = 1,
    headers: Mapping[str, str] | None = None,
    event_id: uuid.UUID | str | None = None,
    schemas: SchemaStore | str | os.PathLike[str] = "schemas",
    table: TableRef | None = None,
    columns: ColumnMap | None = None,
) -> uuid.UUID:
    """Insert one event into the outbox inside ``conn``'s current transaction; returns its id.

    Raises SchemaNotFoundError or PayloadInvalidError (nothing is written) when the payload does not fit
    ``event_type`` / ``schema_version``.
    """
    encoder = _encoder(schemas)
    stored = encoder.store.get(event_type, schema_version)
    body = payload_json(stored.parsed, payload, f"{event_type} v{schema_version}")
    encoder.encode(event_type, schema_version, body)
    event_uuid = uuid7() if event_id is None else uuid.UUID(str(event_id))
    table = table or TableRef()
    cols = columns or ColumnMap()
    values: dict[str, object] = {
        "id": event_uuid,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "event_type": event_type,
        "payload": body.decode(),
    }
    if cols.schema_version is not None:
        values["schema_version"] = schema_version
    if cols.headers is not None:
        row_headers = dict(headers or {})
        # A context the caller gave is kept whole: its traceparent and tracestate belong together.
        if not any(key.lower() in (TRACEPARENT, TRACESTATE) for key in row_headers):
            row_headers.update(current_headers())
        if row_headers:
            values["headers"] = orjson.dumps(row_headers).decode()
    mapping = cols.as_dict()
    casts = {"payload": "::jsonb", "headers": "::jsonb"}
    query = sql.SQL("INSERT INTO {}.{} ({}) VALUES ({})").format(
        sql.Identifier(table.schema),
        sql.Identifier(table.name),
        sql.SQL(", ").join(sql.Identifier(str(mapping[field])) for field in values),
        sql.SQL(", ").join(sql.SQL("%s" + casts.get(field, "")) for field in values),
    )
    conn.execute(query, list(values.values()))
    return event_uuid
