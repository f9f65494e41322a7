"""Where did event X go: at DEBUG, `cdc run` logs one line per acknowledged delivery (event id, topic,
partition, offset), dead letters included, and never the payload."""

from __future__ import annotations

import re

from tests.plugins.pipeline import order_placed, wait_until

MARKER = "payload-marker-7f3a"


def test_debug_log_says_where_each_event_went_and_never_what_it_carried(outbox, pipeline_process, consume):
    proc = pipeline_process(CDC_LOG_LEVEL="DEBUG")
    proc.wait_streaming()
    events = [outbox.event(f"agg-{i % 3}", order_placed(f"{MARKER}-{i}")) for i in range(12)]
    bad = outbox.event("agg-0", {"order_id": MARKER})  # misses required fields: a dead letter
    txn = outbox.commit([*events, bad])
    records = consume(outbox.topic("order"), len(events), timeout=60)
    assert len(records) == len(events)
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the transaction to be confirmed")
    log = proc.log()
    for record in records:
        line = (
            f"event '{record.headers['id'].decode()}' acknowledged: {record.topic} [{record.partition}] "
            f"@ {record.offset}"
        )
        assert line in log, f"no delivery line for {line!r}"
    dead = consume(outbox.dlq_topic, 1, timeout=30)
    assert re.search(
        rf"event '{bad.id}' acknowledged: {re.escape(outbox.dlq_topic)} \[{dead[0].partition}\] @ ", log
    )
    assert MARKER not in log
    assert proc.terminate() == 0


def test_at_info_there_is_no_line_per_delivery(outbox, pipeline_process, consume):
    proc = pipeline_process()
    proc.wait_streaming()
    outbox.commit([outbox.event("agg-1")])
    assert len(consume(outbox.topic("order"), 1, timeout=60)) == 1
    assert proc.terminate() == 0
    assert "acknowledged:" not in proc.log()
