"""What becomes an event besides a plain outbox row: transactional logical messages with the prefix
`outbox`; and a topic that may not be created, where the event waits instead of going into the void."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from cdc.avro.store import SchemaStore
from tests.integration.stream.test_pipeline import decode_value
from tests.plugins.kafka import create_topic
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed, topic_size, wait_until


def emit(dsn: str, body: dict, *, transactional: bool = True, commit: bool = True) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pg_logical_emit_message(%s, 'outbox', %s)", (transactional, json.dumps(body)))
        conn.commit() if commit else conn.rollback()


def message_body(outbox, aggregate_id: str) -> dict:
    outbox.topic("order")
    return {
        "id": str(uuid.uuid4()),
        "aggregate_type": "order",
        "aggregate_id": aggregate_id,
        "event_type": "OrderPlaced",
        "schema_version": 1,
        "payload": order_placed(f"o-{aggregate_id}"),
        "headers": {"traceparent": "00-abc-def-01"},
    }


@pytest.mark.core
@pytest.mark.pg(min=14)
def test_transactional_outbox_messages_are_events_others_are_not(outbox, pipeline_process, consume):
    proc = pipeline_process()
    proc.wait_streaming()
    committed = message_body(outbox, "m-1")
    rolled_back = message_body(outbox, "m-2")
    not_transactional = message_body(outbox, "m-3")
    emit(outbox.dsn, committed)
    emit(outbox.dsn, rolled_back, commit=False)
    emit(outbox.dsn, not_transactional, transactional=False)
    after = message_body(outbox, "m-4")
    emit(outbox.dsn, after)

    records = consume(outbox.topic("order"), 2, timeout=30)
    # m-1 and m-4 may go to different partitions: no order between them.
    assert sorted(r.headers["id"].decode() for r in records) == sorted([committed["id"], after["id"]])
    first = next(r for r in records if r.key == b"m-1")
    assert first.key == b"m-1"
    assert first.headers["event_type"] == b"OrderPlaced" and first.headers["schema_version"] == b"1"
    assert first.headers["traceparent"] == b"00-abc-def-01"
    assert decode_value(SchemaStore(SCHEMAS_DIR), first.value) == ("OrderPlaced", 1, committed["payload"])
    proc.wait_for_log("ignored a non-transactional 'outbox' message", timeout=10)
    # Nothing else arrives later: the rolled-back and the non-transactional message are not events.
    assert len(consume(outbox.topic("order"), 3, timeout=3)) == 2
    assert proc.terminate() == 0


def test_missing_topic_waits_when_creation_is_off_then_goes_on(
    outbox, pipeline_process, consume, kafka_admin, kafka_bootstrap
):
    topic = outbox.topic("order")
    create_topic(kafka_admin, outbox.dlq_topic)
    proc = pipeline_process(CDC_CREATE_TOPICS="false", CDC_BACKOFF_INITIAL="0.2", CDC_BACKOFF_MAX="0.5")
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("a-1"), outbox.event("a-1")])
    proc.wait_for_log(f"topic '{topic}' does not exist and create_topics is off", timeout=30)
    # It waits: the slot is not confirmed past the event, nothing is produced anywhere.
    wait_until(lambda: "(attempt 2); waiting, with backoff" in proc.log(), 10, "a retry log line")
    assert outbox.confirmed_lsn() < txn.lsn_after
    create_topic(kafka_admin, topic, partitions=3)
    records = consume(topic, 2, timeout=60)
    assert [r.headers["id"].decode() for r in records] == txn.ids
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the slot confirmed past the event")
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0
    assert proc.terminate() == 0
