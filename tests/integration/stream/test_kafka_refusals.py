"""Records the broker refuses (issue 17, items 4 and 5): a record under the producer's limit but over the
topic's, or one the topic's settings make invalid, goes to the dead-letter topic with its id; the stream
goes on without an exit; and nothing of a key is appended behind a refused record, so that the replay that
follows a refusal cannot put a later event before an earlier one."""

from __future__ import annotations

import base64
import os
import time

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.integration.test_metrics import get, metric
from tests.kafka_admin import create_topics, settled
from tests.plugins.kafka import Record
from tests.plugins.pipeline import Event, Outbox, free_port, wait_until

pytestmark = pytest.mark.integration

LIMIT = 20_000
BEHIND = 6_000  # small records behind the large one: more than one producer batch (batch.size 1 MB)


def blob() -> str:
    """40 KB that lz4 cannot shrink below the topic's limit: the broker sees it as large as it is."""
    return base64.b64encode(os.urandom(30_000)).decode()


def create_topic(admin: AdminClient, name: str, **config: str) -> None:
    create_topics(admin, [NewTopic(name, num_partitions=3, replication_factor=1, config=config)])


def first_seen_order(records: list[Record]) -> dict[str, list[str]]:
    """Event ids per key in the order a consumer meets them, duplicates (replays) after their first copy
    dropped: what an idempotent consumer processes."""
    by_key: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        ids = by_key.setdefault(r.key.decode(), [])
        event_id = r.headers["id"].decode()
        if event_id not in ids:
            ids.append(event_id)
    return by_key


def expected_order(events: list[Event], poison: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        if e.id not in poison:
            out.setdefault(e.aggregate_id, []).append(e.id)
    return out


def read_all(consume, topic: str, n: int) -> list[Record]:
    """At least ``n`` records, and whatever replays came with them."""
    records = consume(topic, n, timeout=60)
    assert len({r.headers["id"] for r in records}) >= n or len(records) >= n, records
    time.sleep(1)
    return consume(topic, 10 * n, timeout=3)


def test_an_event_above_the_topic_limit_is_dead_lettered_before_it_is_sent(
    outbox: Outbox, pipeline_process, consume, kafka_admin
):
    topic = outbox.topic("order")
    create_topic(kafka_admin, topic, **{"max.message.bytes": str(LIMIT)})
    proc = pipeline_process()
    proc.wait_streaming()
    big = outbox.event("k1", headers={"blob": blob()})
    events = [outbox.event("k1"), big, outbox.event("k1"), outbox.event("k2")]
    outbox.commit(events)
    last = outbox.commit([outbox.event("k1")])
    events += last.events

    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert [(r.headers["id"].decode(), r.headers["error_reason"]) for r in dead] == [(big.id, b"too_large")]
    assert b"max.message.bytes" in dead[0].headers["error_message"]
    records = read_all(consume, topic, len(events) - 1)
    assert first_seen_order(records) == expected_order(events, {big.id})
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed past the last row")
    assert "producer batches now at most" in proc.log()
    assert "replaying from the slot" not in proc.log()  # found before it was sent: no refusal
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0


def test_a_batch_the_broker_refuses_is_replayed_in_order_and_its_culprit_dead_lettered(
    outbox: Outbox, pipeline_process, consume, kafka_admin
):
    """The topic's limit drops while the pipeline runs (it read the old one): the broker refuses the batch
    with the large record, and the producer stops before anything goes behind it. The pipeline replays,
    reads the new limit, dead-letters the large record and sends the rest in their order."""
    topic = outbox.topic("order")
    create_topic(kafka_admin, topic)
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port))
    proc.wait_streaming()
    events = outbox.commit([outbox.event("k1"), outbox.event("k2")]).events
    consume(topic, 2, timeout=60)  # the route is made, with the topic's limit of then
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(LIMIT), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    settled(
        lambda left: kafka_admin.incremental_alter_configs([resource])[resource].result(timeout=left),
        "alter configs",
    )

    # The large record in the first batch of a transaction of several: the producer holds the next batches
    # of the partition while the first is in flight. Without the gapless guarantee they are appended as
    # soon as the first is refused, before the replay sends its good records again: out of order.
    big = outbox.event("k1", headers={"blob": blob()})
    batch = [outbox.event("k1"), big, *(outbox.event("k1") for _ in range(BEHIND)), outbox.event("k2")]
    last = outbox.commit(batch)
    events += batch

    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert [(r.headers["id"].decode(), r.headers["error_reason"]) for r in dead] == [(big.id, b"too_large")]
    records = read_all(consume, topic, len(events) - 1)
    assert first_seen_order(records) == expected_order(events, {big.id})
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed past the last row")
    assert "replaying from the slot" in proc.log(), proc.tail()
    scraped = get(port, "/metrics")[1]
    assert metric(scraped, "cdc_refusal_replays_total") >= 1
    assert metric(scraped, "cdc_dead_letter_events_total", '{reason="too_large"}') >= 1
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0


def test_a_record_the_broker_refuses_even_alone_is_dead_lettered_with_its_reason(
    outbox: Outbox, pipeline_process, consume, kafka_admin
):
    """No size check can see this one coming: the topic takes no record older than 3 s, and the event was
    committed before the pipeline started. Refused in its batch, then alone, it is dead-lettered; the
    event after it arrives."""
    topic = outbox.topic("order")
    create_topic(kafka_admin, topic, **{"message.timestamp.before.max.ms": "3000"})
    old = outbox.event("k1")
    outbox.commit([old])
    time.sleep(4)
    proc = pipeline_process()
    proc.wait_streaming()

    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert [(r.headers["id"].decode(), r.headers["error_reason"]) for r in dead] == [
        (old.id, b"refused_by_kafka")
    ]
    assert (
        b"INVALID_TIMESTAMP" in dead[0].headers["error_message"]
        or b"imestamp" in dead[0].headers["error_message"]
    )
    fresh = outbox.commit([outbox.event("k1")])
    records = consume(topic, 1, timeout=30)
    assert [r.headers["id"].decode() for r in records] == [fresh.events[0].id]
    wait_until(lambda: outbox.confirmed_lsn() >= fresh.lsn_after, 60, "the slot confirmed past the last row")
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0


def test_a_dead_letter_takes_the_time_it_is_written_so_a_topic_refusing_old_records_takes_it(
    outbox: Outbox, pipeline_process, consume, kafka_admin
):
    """The dead-letter topic refuses old records too (as a broker-wide default would): the dead letter of an
    event refused for its commit time must not be refused for the same time, or the pipeline stops and
    stops again at every restart, pinning the slot."""
    topic = outbox.topic("order")
    create_topic(kafka_admin, topic, **{"message.timestamp.before.max.ms": "3000"})
    create_topic(kafka_admin, outbox.dlq_topic, **{"message.timestamp.before.max.ms": "3000"})
    old = outbox.commit([outbox.event("k1")])
    time.sleep(4)
    started_ms = time.time() * 1000
    proc = pipeline_process()
    proc.wait_streaming()

    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert [(r.headers["id"].decode(), r.headers["error_reason"]) for r in dead] == [
        (old.events[0].id, b"refused_by_kafka")
    ]
    assert dead[0].timestamp_ms >= started_ms - 1000, "the dead letter is timestamped when it was written"
    commit_time = dead[0].headers["commit_time"].decode()
    assert commit_time.endswith("+00:00") and commit_time[:4] == time.strftime("%Y")
    fresh = outbox.commit([outbox.event("k1")])
    wait_until(lambda: outbox.confirmed_lsn() >= fresh.lsn_after, 60, "the slot confirmed past the last row")
    assert proc.alive(), proc.tail()
    assert proc.terminate() == 0
