from __future__ import annotations

import random
import time

import pytest

from cdc.errors import CheckpointError
from cdc.stream.checkpoint import AckLatency, AckTracker


def run_txn(tracker: AckTracker, xid: int, events: int, end_lsn: int):
    txn = tracker.begin(xid, end_lsn - 8, 0)
    for _ in range(events):
        txn.sent()
    tracker.commit(txn, end_lsn)
    return txn


def test_empty_transaction_confirms_at_commit():
    tracker = AckTracker(confirmed_lsn=100)
    run_txn(tracker, 1, 0, 200)
    assert tracker.confirmed_lsn == 200
    assert tracker.idle


def test_commit_waits_for_every_ack_of_the_transaction():
    tracker = AckTracker(100)
    txn = run_txn(tracker, 1, 3, 200)
    txn.delivered(None)
    txn.delivered(None)
    assert tracker.confirmed_lsn == 100
    txn.delivered(None)
    assert tracker.confirmed_lsn == 200
    assert tracker.in_flight == 0


def test_acks_before_commit_do_not_confirm():
    tracker = AckTracker(100)
    txn = tracker.begin(1, 190, 0)
    txn.sent()
    txn.delivered(None)
    assert tracker.confirmed_lsn == 100
    tracker.commit(txn, 200)
    assert tracker.confirmed_lsn == 200


def test_later_transaction_acked_first_waits_for_the_earlier():
    tracker = AckTracker(100)
    first = run_txn(tracker, 1, 2, 200)
    second = run_txn(tracker, 2, 1, 300)
    second.delivered(None)
    assert tracker.confirmed_lsn == 100
    first.delivered(None)
    assert tracker.confirmed_lsn == 100
    first.delivered(None)
    assert tracker.confirmed_lsn == 300


def test_random_ack_order_never_passes_an_unacked_event():
    rng = random.Random(7)
    tracker = AckTracker(0)
    txns = [run_txn(tracker, i, rng.randint(0, 5), (i + 1) * 100) for i in range(50)]
    acks = [t for t in txns for _ in range(t.outstanding)]
    rng.shuffle(acks)
    remaining = {t.xid: t.outstanding for t in txns}
    for txn in acks:
        txn.delivered(None)
        remaining[txn.xid] -= 1
        first_unacked = next((t for t in txns if remaining[t.xid]), None)
        if first_unacked is None:
            assert tracker.confirmed_lsn == txns[-1].end_lsn
        else:
            assert tracker.confirmed_lsn < first_unacked.end_lsn
            earlier = [t.end_lsn for t in txns if t.end_lsn < first_unacked.end_lsn]
            assert tracker.confirmed_lsn == (earlier[-1] if earlier else 0)


def test_failed_delivery_blocks_the_watermark_and_is_recorded():
    tracker = AckTracker(100)
    first = run_txn(tracker, 1, 2, 200)
    second = run_txn(tracker, 2, 1, 300)
    first.delivered(None)
    first.delivered("broker said no")
    second.delivered(None)
    assert tracker.confirmed_lsn == 100
    assert tracker.failure is not None
    assert tracker.failure.xid == 1 and tracker.failure.error == "broker said no"


def test_keepalive_confirms_only_when_nothing_is_open_or_pending():
    tracker = AckTracker(100)
    assert tracker.keepalive(150)
    assert tracker.confirmed_lsn == 150
    txn = tracker.begin(1, 190, 0)
    assert not tracker.keepalive(500)
    txn.sent()
    tracker.commit(txn, 200)
    assert not tracker.keepalive(500)
    assert tracker.confirmed_lsn == 150
    txn.delivered(None)
    assert tracker.confirmed_lsn == 200
    assert tracker.keepalive(500)
    assert tracker.confirmed_lsn == 500


def test_confirmed_lsn_never_moves_back():
    tracker = AckTracker(1000)
    tracker.keepalive(10)
    run_txn(tracker, 1, 0, 500)
    assert tracker.confirmed_lsn == 1000


def test_begin_inside_an_open_transaction_is_an_error():
    tracker = AckTracker()
    tracker.begin(1, 10, 0)
    with pytest.raises(CheckpointError, match="still open"):
        tracker.begin(2, 20, 0)


def test_commit_of_a_transaction_that_is_not_open_is_an_error():
    tracker = AckTracker()
    txn = run_txn(tracker, 1, 0, 10)
    with pytest.raises(CheckpointError, match="not the open one"):
        tracker.commit(txn, 10)


def test_ack_latency_percentiles_weight_each_transaction_by_its_events():
    latency = AckLatency()
    latency.record(5, 98)
    latency.record(40, 1)
    latency.record(70_000, 1)  # above the last bucket: counted there, max kept exact
    assert latency.total == 100
    assert latency.percentile(0.5) == 5
    assert latency.percentile(0.99) == 40
    assert latency.percentile(1.0) == AckLatency.LIMIT_MS + 1
    assert latency.max_ms == 70_000
    assert AckLatency().percentile(0.5) is None


def test_a_transaction_is_timed_when_its_last_event_is_acknowledged():
    latency = AckLatency()
    tracker = AckTracker(0, latency=latency)
    commit_us = time.time_ns() // 1000 - 30_000  # committed 30 ms ago
    txn = tracker.begin(1, 90, commit_us)
    txn.sent()
    txn.sent()
    tracker.commit(txn, 100)
    txn.delivered(None)
    assert latency.total == 0
    txn.delivered(None)
    assert latency.total == 2
    assert 30 <= latency.max_ms < 1000
    empty = tracker.begin(2, 190, commit_us)
    tracker.commit(empty, 200)
    assert latency.total == 2, "a transaction without events has no latency"


class _Report:
    """What a confluent-kafka delivery report offers the tracker: the offset Kafka gave (None when none)."""

    def __init__(self, offset: int | None) -> None:
        self._offset = offset

    def offset(self) -> int | None:
        return self._offset


def test_a_success_without_an_offset_is_not_an_acknowledgement():
    # librdkafka's "implicitly acked by subsequent batch success": err None, no offset, maybe not in Kafka.
    tracker = AckTracker(100)
    txn = run_txn(tracker, 7, 2, 200)
    txn.delivered(None, _Report(41))
    txn.delivered(None, _Report(None))
    assert tracker.confirmed_lsn == 100
    assert tracker.failure is not None and tracker.failure.xid == 7
    assert "without an offset" in str(tracker.failure.error)


def test_a_success_with_an_offset_is_one():
    tracker = AckTracker(100)
    txn = run_txn(tracker, 7, 1, 200)
    txn.delivered(None, _Report(0))
    assert tracker.confirmed_lsn == 200 and tracker.failure is None


def test_the_last_acknowledged_outbox_transaction_is_kept_for_recover():
    """`cdc recover` starts from the commit time of the last transaction with events that Kafka
    acknowledged: an empty transaction (our own saved-position write, read back) never counts."""
    tracker = AckTracker(100)
    assert tracker.last_outbox == (0, 0)
    first = tracker.begin(1, 190, 1_000)
    first.sent()
    tracker.commit(first, 200)
    second = tracker.begin(2, 290, 2_000)
    second.sent()
    tracker.commit(second, 300)
    second.delivered(None)
    assert tracker.last_outbox == (0, 0), "the second is acknowledged, the first not yet"
    first.delivered(None)
    assert tracker.last_outbox == (300, 2_000)
    empty = tracker.begin(3, 390, 3_000)
    tracker.commit(empty, 400)
    assert tracker.confirmed_lsn == 400
    assert tracker.last_outbox == (300, 2_000)
