"""Reading a slot's checkpoint back from the shared, compacted checkpoint topic (issue 42, item 6): from the
topic's end, in growing windows, so that a start costs what the slot's last commits cost, whatever the
topic's age; and never taking a record the pipeline did not write for a checkpoint (issue 44, item 3)."""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from cdc.errors import SinkError
from cdc.stream import checkpoint_topic
from cdc.stream.checkpoint_topic import CHECKPOINT_TOPIC_CONFIG, read_checkpoint
from cdc.stream.identity import SlotIdentity
from cdc.stream.transactions import Checkpoint
from tests.plugins.kafka import client_config
from tests.plugins.pipeline import Outbox

pytestmark = pytest.mark.integration

SLOT = SlotIdentity("7412", "cdc_outbox", 0x16B3748)


def checkpoint(end_lsn: int) -> bytes:
    return Checkpoint(end_lsn, 1_796_000_000_000_000 + end_lsn, "7412", 1, xid=end_lsn).encode(
        SLOT, database="shop"
    )


@pytest.fixture
def topic(outbox: Outbox, unique_name, kafka_bootstrap, kafka_admin):
    name = unique_name("ckpt")
    outbox.topics.append(name)
    new = NewTopic(name, num_partitions=1, replication_factor=1, config=CHECKPOINT_TOPIC_CONFIG)
    kafka_admin.create_topics([new])[name].result(timeout=30)
    producer = Producer({**client_config(kafka_bootstrap), "linger.ms": 50, "enable.idempotence": True})
    failures: list[object] = []

    def write(records: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in records:
            while True:
                try:
                    producer.produce(name, value, key, on_delivery=lambda e, _m: e and failures.append(e))
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(60) == 0
        assert not failures, failures[:3]

    settings = dataclasses.replace(outbox.settings, checkpoint_topic=name)
    yield settings, write


def others(n: int, start: int = 0) -> list[tuple[bytes, bytes | None]]:
    """Checkpoints of other slots, as a busy shared topic holds them."""
    return [(f"7412/other-{i % 50}@0/1".encode(), checkpoint(i)) for i in range(start, start + n)]


def test_the_latest_checkpoint_of_the_key_is_found_behind_many_of_other_slots(topic, monkeypatch):
    settings, write = topic
    write([(SLOT.key, checkpoint(100)), *others(30_000), (SLOT.key, checkpoint(200)), *others(10_000)])
    assert read_checkpoint(settings, SLOT.key, timeout=30).end_lsn == 200
    # Found in the windows at the end: 1,000 then 16,000 records, never the 50,000 before.
    read: list[int] = []
    real = checkpoint_topic._read_windows

    def counting(consumer, settings, topic, key, starts, todo, found, deadline, timeout):
        read.append(sum(1 for _ in starts))
        return real(consumer, settings, topic, key, starts, todo, found, deadline, timeout)

    monkeypatch.setattr(checkpoint_topic, "_read_windows", counting)
    assert read_checkpoint(settings, SLOT.key, timeout=30).end_lsn == 200
    assert len(read) == 2, read


def test_a_checkpoint_at_the_topics_beginning_is_found_by_growing_windows(topic):
    settings, write = topic
    write([(SLOT.key, checkpoint(100)), *others(40_000)])
    assert read_checkpoint(settings, SLOT.key, timeout=60).end_lsn == 100


def test_a_tombstone_after_the_checkpoint_reads_as_none(topic):
    settings, write = topic
    write([(SLOT.key, checkpoint(100)), *others(10), (SLOT.key, None), *others(10)])
    assert read_checkpoint(settings, SLOT.key, timeout=30) is None


def test_a_record_under_the_key_that_is_no_checkpoint_is_ignored_and_said(topic, caplog):
    """Whoever writes into the topic under the slot's key (an event, before routing refused it) cannot
    decide what a start skips, nor make the start fail: the pipeline's own latest checkpoint counts."""
    settings, write = topic
    write(
        [(SLOT.key, checkpoint(100)), (SLOT.key, b"\x02\x06abc"), (SLOT.key, b'{"end_lsn": 7}'), *others(5)]
    )
    with caplog.at_level(logging.WARNING, logger="cdc.transactions"):
        assert read_checkpoint(settings, SLOT.key, timeout=30).end_lsn == 100
    warnings = [r.getMessage() for r in caplog.records if "no checkpoint" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("2 records"), warnings


def test_a_transaction_left_open_by_another_pipeline_never_hides_the_latest_checkpoint(
    topic, kafka_bootstrap, unique_name
):
    """Another pipeline sharing the topic stopped between its checkpoint and its commit: its transaction
    stays open, and a read_committed read stops at its first record (the last stable offset), before this
    slot's latest checkpoint. The read waits for it to end, within its bound; it never takes the older
    checkpoint (which would publish again what was committed)."""
    settings, write = topic
    write([(SLOT.key, checkpoint(100))])
    other = Producer({**client_config(kafka_bootstrap), "transactional.id": unique_name("other-pipeline")})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(settings.checkpoint_topic, checkpoint(7), b"7412/other@0/1")
    assert other.flush(30) == 0
    write([(SLOT.key, checkpoint(200))])  # committed after the other one's record: past the stable offset
    with pytest.raises(SinkError, match="holds a Kafka transaction left open") as hidden:
        read_checkpoint(settings, SLOT.key, timeout=3)
    assert "from offset 1" in str(hidden.value)
    ended = threading.Timer(1.0, lambda: other.abort_transaction(30))
    ended.start()
    try:
        assert read_checkpoint(settings, SLOT.key, timeout=30).end_lsn == 200
    finally:
        ended.join()
