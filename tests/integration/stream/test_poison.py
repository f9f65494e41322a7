"""One `cdc run`, every kind of poison row the stream must survive, each followed by good rows of the same
aggregate: the process never exits, the good rows arrive in order per key, every poison row is in the
dead-letter topic with its id, and the slot is confirmed past the last row (issue 17's end-to-end test). The
topic takes less than the producer may send (item 4's check before sending).

Records the broker refuses at delivery (items 4 and 5) have theirs: test_kafka_refusals.py."""

from __future__ import annotations

import base64
import json
import os
import uuid

import psycopg
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
