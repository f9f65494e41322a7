"""One `cdc run`, every kind of poison row the stream must survive, each followed by good rows of the same
aggregate: the process never exits, the good rows arrive in order per key, every poison row is in the
dead-letter topic with its id, and the slot is confirmed past the last row (issue 17's end-to-end test). The
topic takes less than the producer may send (item 4's check before sending).

Records the broker refuses at delivery (items 4 and 5) have theirs: test_kafka_refusals.py."""

from __future__ import annotations

import base64
import json
import os
import re
import uuid

import psycopg
import pytest
from confluent_kafka.admin import NewTopic

from tests.kafka_admin import create_topics
from tests.plugins.pipeline import order_placed, wait_until

TOPIC_LIMIT = 100_000  # the topic's max.message.bytes: a tenth of what the producer may send


def test_poison_rows_go_to_the_dead_letter_topic_and_the_stream_goes_on(
    outbox, pipeline_process, consume, kafka_admin
):
    topic = outbox.topic("order")
    new = NewTopic(
        topic, num_partitions=3, replication_factor=1, config={"max.message.bytes": str(TOPIC_LIMIT)}
    )
    create_topics(kafka_admin, [new])
    proc = pipeline_process(CDC_AGGREGATE_TYPES="order")
    proc.wait_streaming()
    table = psycopg.sql.Identifier(outbox.table)
    outbox.conn.execute(
        psycopg.sql.SQL("ALTER TABLE {} ALTER COLUMN aggregate_id DROP NOT NULL").format(table)
    )

    def good(key: str, n: int = 2):
        return [outbox.event(key) for _ in range(n)]

    poison, goods = [], []
    # A row header named like a system header: not poison, it arrives, with its own id first.
    shadow = outbox.event("p-shadow", headers={"id": "req-42"})
    goods.append(outbox.commit([shadow, *good("p-shadow")]))
    # An invalid payload with 2 MB of row headers: its dead letter goes reduced.
    fat = outbox.event("p-fat", order_placed("o-fat", amount_cents="many"), headers={"blob": "x" * 2_000_000})
    poison.append(fat.id)
    goods.append(outbox.commit([fat, *good("p-fat")]))
    # A 2 MB key: too large itself, and so is its dead letter as it is.
    huge = outbox.event("k" * 2_000_000)
    poison.append(huge.id)
    goods.append(outbox.commit([huge, *good("p-huge")]))
    # Under the producer's limit, over the topic's: Kafka would refuse it, so it is not sent.
    over = outbox.event("p-over", headers={"blob": base64.b64encode(os.urandom(TOPIC_LIMIT)).decode()})
    poison.append(over.id)
    goods.append(outbox.commit([over, *good("p-over")]))
    # An aggregate type that makes no topic name, and one outside the allow-list.
    for aggregate_type in ("order line", "invoice"):
        bad = outbox.event("p-type", aggregate_type=aggregate_type)
        poison.append(bad.id)
        goods.append(outbox.commit([bad, *good("p-type")]))
    # A malformed row: a null aggregate_id.
    malformed = str(uuid.uuid4())
    poison.append(malformed)
    with outbox.conn.transaction():
        outbox.conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
                " VALUES (%s, 'order', NULL, 'OrderPlaced', 1, %s)"
            ).format(table),
            (malformed, json.dumps(order_placed("o-null"))),
        )
    goods.append(outbox.commit(good("p-null")))
    last = outbox.commit(good("p-last", 1))

    dead = consume(outbox.dlq_topic, len(poison), timeout=60)
    assert sorted(r.headers["id"].decode() for r in dead) == sorted(poison)
    expected = [e for t in [*goods, last] for e in t.events if e.id not in poison]
    records = consume(topic, len(expected), timeout=60)
    by_key: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key.setdefault(r.key.decode(), []).append(r.headers["id"].decode())
    for key in {e.aggregate_id for e in expected}:
        assert by_key[key] == [e.id for e in expected if e.aggregate_id == key], f"order of {key}"
    assert [r for r in records if r.headers["id"].decode() == shadow.id][0].headers["row_id"] == b"req-42"
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed past the last row")
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0


FORGED_LINE = "2026-12-07 00:00:00,000 ERROR cdc.pipeline: FORGED"
# What no line of the log may hold raw: C0/C1 controls, DEL, line separators, bidi and zero-width characters.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


@pytest.mark.parametrize(
    "log_format,delivery", [("text", "at-least-once"), ("json", "exactly-once")], ids=["text", "json-eo"]
)
def test_a_row_is_data_never_control(outbox, pipeline_process, consume, unique_name, log_format, delivery):
    """Issue 44: a row's text can neither forge a log line (newlines, terminal controls, bidi overrides, 10 KB
    of it, in a row or in an `outbox` logical message's free-text id) nor write into a topic the pipeline
    owns: with topic_template = "<prefix>.{aggregate_type}", aggregate types 'dlq' and 'checkpoints' name
    the dead-letter and the checkpoint topics. Each hostile event is dead-lettered with its reason, the good
    ones after it arrive, and the log stays one record per line."""
    dlq = f"{outbox.topic_prefix}.dlq"
    checkpoints = f"{outbox.topic_prefix}.checkpoints"
    outbox.topics += [dlq, checkpoints]
    proc = pipeline_process(
        CDC_DLQ_TOPIC=dlq,
        CDC_CHECKPOINT_TOPIC=checkpoints,
        CDC_DELIVERY=delivery,
        CDC_LOG_FORMAT=log_format,
        CDC_MAX_DEAD_LETTERS="1000",
    )
    proc.wait_for_log("streaming from slot")
    hostile_types = [
        f"NoSuchEvent\n{FORGED_LINE} event_type",
        "Bell\x07Clear\x1b[2J\x1b[31m",
        "abc\u202edcba\u2066x\u2069",
        "T" * 10_000,
    ]
    poison: dict[str, str] = {}  # id -> the reason expected
    goods = []
    for n, event_type in enumerate(hostile_types):
        bad = outbox.event(f"h-{n}", event_type=event_type)
        poison[bad.id] = "schema_not_found"
        goods.append(outbox.commit([bad, outbox.event(f"h-{n}")]))
    for aggregate_type in ("dlq", "checkpoints"):
        bad = outbox.event(f"{SLOT_KEY_LIKE}", aggregate_type=aggregate_type)
        poison[bad.id] = "reserved_topic"
        goods.append(outbox.commit([bad, outbox.event("h-owned")]))
    # An `outbox` logical message whose free-text id forges a line, and which lacks its payload.
    forged_id = f"m-1\n{FORGED_LINE} message id \x1b[2J\u202e"
    body = json.dumps({"id": forged_id, "aggregate_type": "order", "aggregate_id": "m", "event_type": "E"})
    with outbox.conn.transaction():
        outbox.conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", (body,))
    poison[forged_id] = "malformed_event"
    last = outbox.commit([outbox.event("h-last")])

    dead = consume(dlq, len(poison), timeout=90)
    assert {r.headers["id"].decode(): r.headers["error_reason"].decode() for r in dead} == poison
    expected = {e.id for t in [*goods, last] for e in t.events if e.id not in poison}
    records = consume(outbox.topic("order"), len(expected), timeout=60)
    assert {r.headers["id"].decode() for r in records} == expected
    if delivery == "exactly-once":
        for r in consume(checkpoints, 1, timeout=30):
            assert json.loads(r.value)["end_lsn"], "a record in the checkpoint topic that is no checkpoint"
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed past the last row")
    assert proc.terminate() == 0, proc.tail()

    log = proc.log()
    for clash in ("the dead-letter topic", "the exactly-once checkpoint topic"):
        assert f"topic_template = '{outbox.topic_prefix}.{{aggregate_type}}' can name {clash}" in log
    lines = log.splitlines()
    for line in lines:
        assert not UNSAFE.search(line), f"a raw control or format character in: {line[:120]!r}"
        assert len(line) < 2_300, f"a line of {len(line)} characters"
        if log_format == "json":
            json.loads(line)  # one record, whole, per line
        else:
            assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ", line), line[:120]
        assert not line.startswith(FORGED_LINE[:23]), line[:120]
    dead_lines = [line for line in lines if "goes to the dead-letter topic" in line]
    assert len(dead_lines) == len(poison), "one record per dead-lettered event"


SLOT_KEY_LIKE = "7412/slot@0/16B3748"  # a key shaped like a checkpoint's, for the event aimed at that topic
