"""Guarantee 4 beyond a payload that does not fit: an event too large for Kafka goes to the dead-letter
topic without its payload; and a team that would rather stop than skip sets on_invalid_event = "stop"."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from tests.integration.test_metrics import get, metric
from tests.plugins.pipeline import free_port, order_placed, topic_size, wait_until


def test_an_event_above_message_max_bytes_goes_to_the_dlq_without_its_payload(
    outbox, pipeline_process, consume
):
    proc = pipeline_process()
    proc.wait_streaming()
    big = order_placed("o-big")
    big["customer_id"] = "c" * 2_000_000  # 2 MB: above the producer's default message.max.bytes (1 MB)
    txn = outbox.commit([outbox.event("b-1"), outbox.event("b-2", big), outbox.event("b-3")])
    dead = consume(outbox.dlq_topic, 1, timeout=30)
    assert len(dead) == 1
    record = dead[0]
    assert record.headers["id"].decode() == txn.ids[1]
    assert record.headers["error_reason"] == b"too_large"
    assert record.headers["error_class"] == b"EventTooLargeError"
    assert record.value is None, "the payload is omitted from the dead-letter record"
    arrived = consume(outbox.topic("order"), 2, timeout=30)
    # Two keys, maybe on two partitions: no order between them to expect.
    assert {r.headers["id"].decode() for r in arrived} == {txn.ids[0], txn.ids[2]}
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the transaction confirmed")
    assert proc.terminate() == 0


def test_on_invalid_event_stop_stops_without_confirming_past_the_bad_event(
    outbox, pipeline_process, kafka_bootstrap
):
    proc = pipeline_process(CDC_ON_INVALID_EVENT="stop")
    proc.wait_streaming()
    good = outbox.commit([outbox.event("s-1")])
    wait_until(lambda: outbox.confirmed_lsn() >= good.lsn_after, 30, "the good event confirmed")
    bad = outbox.commit([outbox.event("s-2", order_placed("o-bad", amount_cents="many"))])
    assert proc.wait(timeout=30) == 1, proc.tail()
    errors = [line for line in proc.log().splitlines() if line.startswith("cdc: error:")]
    assert len(errors) == 1 and "field 'amount_cents' expects long, got string" in errors[0], proc.tail()
    assert outbox.confirmed_lsn() < bad.lsn_after, "the slot must not pass the event it stopped on"
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0


def test_a_rows_id_header_never_passes_for_the_event_id(outbox, pipeline_process, consume):
    """Two events whose rows both carry {"id": "req-42"}: each arrives with its own id first, the row's as
    row_id, so that a consumer reading them sees two events, not one event twice."""
    proc = pipeline_process()
    proc.wait_streaming()
    events = [outbox.event("h-1", headers={"id": "req-42", "traceparent": "00-abc"}) for _ in range(2)]
    outbox.commit(events)
    records = consume(outbox.topic("order"), 2, timeout=30)
    assert [r.headers["id"].decode() for r in records] == [e.id for e in events]
    assert all(r.headers["row_id"] == b"req-42" and r.headers["traceparent"] == b"00-abc" for r in records)
    assert proc.terminate() == 0


def test_an_aggregate_type_that_makes_no_topic_is_a_dead_letter_and_the_stream_goes_on(
    outbox, pipeline_process, consume
):
    proc = pipeline_process()
    proc.wait_streaming()
    bad_types = ["order line", "x" * 300, "ordér"]
    txns = []
    for i, bad in enumerate(bad_types):
        txns.append(outbox.commit([outbox.event(f"t-{i}", aggregate_type=bad), outbox.event(f"t-{i}")]))
    dead = consume(outbox.dlq_topic, len(bad_types), timeout=30)
    assert sorted(r.headers["id"].decode() for r in dead) == sorted(t.ids[0] for t in txns)
    assert {r.headers["error_reason"] for r in dead} == {b"invalid_topic"}
    assert all(r.headers["original_topic"] == b"" for r in dead)
    good = consume(outbox.topic("order"), len(bad_types), timeout=30)
    assert sorted(r.headers["id"].decode() for r in good) == sorted(t.ids[1] for t in txns)
    wait_until(lambda: outbox.confirmed_lsn() >= txns[-1].lsn_after, 30, "the last transaction confirmed")
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0


@pytest.mark.pg(min=14)
def test_a_malformed_change_is_dead_lettered_with_everything_that_could_be_read(
    outbox, pipeline_process, consume
):
    """A row with a null aggregate_id and a logical message that lacks fields: their dead letters keep id,
    types, payload and headers, so that a pruned outbox loses nothing of them. A non-transactional 'outbox'
    message is no event: counted on /metrics and logged with its LSN."""
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port))
    proc.wait_streaming()
    table = psycopg.sql.Identifier(outbox.table)
    outbox.conn.execute(
        psycopg.sql.SQL("ALTER TABLE {} ALTER COLUMN aggregate_id DROP NOT NULL").format(table)
    )
    row_id = str(uuid.uuid4())
    payload = json.dumps(order_placed("o-null"))
    with outbox.conn.transaction():
        outbox.conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload,"
                " headers) VALUES (%s, 'order', NULL, 'OrderPlaced', 1, %s, %s)"
            ).format(table),
            (row_id, payload, json.dumps({"traceparent": "00-abc"})),
        )
        body = json.dumps({"id": "m-1", "aggregate_type": "order", "payload": {"a": 1}})
        outbox.conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", (body,))
    lsn = outbox.conn.execute("SELECT pg_logical_emit_message(false, 'outbox', '{}')::text").fetchone()[0]
    good = outbox.commit([outbox.event("g-1")])
    dead = {r.headers["id"].decode(): r for r in consume(outbox.dlq_topic, 2, timeout=30)}
    assert set(dead) == {row_id, "m-1"}
    row = dead[row_id]
    assert row.headers["error_reason"] == b"malformed_event"
    assert (row.headers["event_type"], row.headers["aggregate_type"]) == (b"OrderPlaced", b"order")
    assert row.headers["traceparent"] == b"00-abc"
    assert json.loads(row.value) == json.loads(payload)
    message = dead["m-1"]
    assert json.loads(message.value) == json.loads(body) and message.headers["aggregate_type"] == b"order"
    assert len(consume(outbox.topic("order"), 1, timeout=30)) == 1
    wait_until(lambda: outbox.confirmed_lsn() >= good.lsn_after, 30, "the good event confirmed")
    assert f"ignored a non-transactional 'outbox' message at {lsn.upper()}" in proc.log()
    assert metric(get(port, "/metrics")[1], "cdc_ignored_outbox_messages_total") == 1
    assert proc.terminate() == 0


def test_an_aggregate_type_outside_the_allow_list_is_a_dead_letter(outbox, pipeline_process, consume):
    proc = pipeline_process(CDC_AGGREGATE_TYPES="order")
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("a-1", aggregate_type="invoice"), outbox.event("a-1")])
    dead = consume(outbox.dlq_topic, 1, timeout=30)
    assert [r.headers["id"].decode() for r in dead] == [txn.ids[0]]
    assert dead[0].headers["error_reason"] == b"aggregate_type_not_allowed"
    assert [r.headers["id"].decode() for r in consume(outbox.topic("order"), 1, timeout=30)] == [txn.ids[1]]
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the transaction confirmed")
    assert proc.terminate() == 0


def test_a_dead_letter_too_large_for_kafka_goes_reduced_and_the_stream_goes_on(
    outbox, pipeline_process, consume
):
    """A 2 MB key (the event is too large itself) and 2 MB of row headers on an invalid payload: neither
    dead-letter record fits as it is, so each goes reduced (the key cut short, no value, no row headers),
    with its id and reason; the good event after them arrives, and the pipeline never exits."""
    proc = pipeline_process()
    proc.wait_streaming()
    huge_key = outbox.event("k" * 2_000_000)
    huge_headers = outbox.event(
        "h-1", order_placed("o-h", amount_cents="many"), headers={"blob": "x" * 2_000_000}
    )
    txn = outbox.commit([huge_key, huge_headers, outbox.event("h-1")])
    dead = {r.headers["id"].decode(): r for r in consume(outbox.dlq_topic, 2, timeout=60)}
    assert set(dead) == {huge_key.id, huge_headers.id}
    assert dead[huge_key.id].headers["error_reason"] == b"too_large"
    assert dead[huge_headers.id].headers["error_reason"] == b"payload_invalid"
    for record in dead.values():
        assert b"too large" in record.headers["cdc_reduced"]
        assert record.value is None and "blob" not in record.headers
        assert record.key is None or len(record.key) <= 256
    good = consume(outbox.topic("order"), 1, timeout=30)
    assert [r.headers["id"].decode() for r in good] == [txn.ids[2]]
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the transaction confirmed")
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0
