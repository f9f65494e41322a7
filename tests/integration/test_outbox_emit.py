"""The producer side: cdc.outbox.emit and the outbox_emit SQL functions, through the pipeline to Kafka."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from cdc.avro.store import SchemaStore
from cdc.errors import PayloadInvalidError, SchemaNotFoundError
from cdc.outbox import emit
from tests.integration.stream.test_pipeline import decode_value
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed


def count_rows(outbox) -> int:
    table = sql.Identifier(outbox.table)
    row = outbox.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    return row[0]


def test_emit_writes_in_the_callers_transaction_and_refuses_bad_payloads(outbox, pipeline_process, consume):
    store = SchemaStore(SCHEMAS_DIR)
    common = {"schemas": store, "table": outbox.settings.table, "columns": outbox.settings.columns}
    outbox.topic("order")
    with psycopg.connect(outbox.dsn) as conn:
        first = emit(
            conn,
            aggregate_type="order",
            aggregate_id="e-1",
            event_type="OrderPlaced",
            payload=order_placed("o-e1"),
            headers={"traceparent": "00-x-y-01"},
            **common,
        )
        conn.rollback()  # the caller's transaction decides: rolled back, no event
        with pytest.raises(PayloadInvalidError, match="amount_cents"):
            emit(
                conn,
                aggregate_type="order",
                aggregate_id="e-2",
                event_type="OrderPlaced",
                payload=order_placed("o-e2", amount_cents="lots"),
                **common,
            )
        with pytest.raises(SchemaNotFoundError):
            emit(
                conn,
                aggregate_type="order",
                aggregate_id="e-2",
                event_type="NoSuchEvent",
                payload={},
                **common,
            )
        conn.rollback()
        kept = emit(
            conn,
            aggregate_type="order",
            aggregate_id="e-3",
            event_type="OrderPlaced",
            payload=order_placed("o-e3"),
            schema_version=2,
            **common,
        )
        conn.commit()
    assert count_rows(outbox) == 1
    assert kept.version == 7 and first.version == 7

    proc = pipeline_process()
    proc.wait_streaming()
    records = consume(outbox.topic("order"), 1, timeout=30)
    assert [r.headers["id"].decode() for r in records] == [str(kept)]
    event_type, version, payload = decode_value(store, records[0].value)
    assert (event_type, version) == ("OrderPlaced", 2)
    assert payload["order_id"] == "o-e3" and payload["coupon"] is None
    assert proc.terminate() == 0


@pytest.mark.pg(min=14)
def test_sql_functions_emit_a_row_or_a_logical_message(outbox, pipeline_process, consume):
    schema, name = outbox.settings.table.schema, outbox.table
    emit_row = sql.Identifier(schema, f"{name}_emit")
    emit_message = sql.Identifier(schema, f"{name}_emit_message")
    payload = psycopg.types.json.Jsonb(order_placed("o-sql"))
    proc = pipeline_process()
    proc.wait_streaming()
    with psycopg.connect(outbox.dsn) as conn:
        row_id = conn.execute(
            sql.SQL("SELECT {}('order', 's-1', 'OrderPlaced', %s)").format(emit_row), (payload,)
        ).fetchone()[0]
        message_id = conn.execute(
            sql.SQL("SELECT {}('order', 's-1', 'OrderPlaced', %s, 1, %s)").format(emit_message),
            (payload, psycopg.types.json.Jsonb({"traceparent": "00-a-b-01"})),
        ).fetchone()[0]
        conn.commit()
    records = consume(outbox.topic("order"), 2, timeout=30)
    assert [r.headers["id"].decode() for r in records] == [str(row_id), str(message_id)]
    assert records[1].headers["traceparent"] == b"00-a-b-01"
    assert all(r.key == b"s-1" for r in records)
    assert count_rows(outbox) == 1, "the message variant never touches the table"
    assert proc.terminate() == 0


@pytest.mark.core
@pytest.mark.pg(max=13)
def test_the_message_function_refuses_on_postgresql_13_where_pgoutput_cannot_carry_messages(outbox):
    """On 13 the walsender reads a logical message and sends nothing: an event emitted so would be lost."""
    emit_message = sql.Identifier(outbox.settings.table.schema, f"{outbox.table}_emit_message")
    payload = psycopg.types.json.Jsonb(order_placed("o-13"))
    with psycopg.connect(outbox.dsn) as conn, pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        conn.execute(sql.SQL("SELECT {}('order', 's-1', 'OrderPlaced', %s)").format(emit_message), (payload,))
    assert "outbox messages need PostgreSQL 14 or later" in str(refused.value)
    assert refused.value.diag.message_hint is not None and "_emit" in refused.value.diag.message_hint
