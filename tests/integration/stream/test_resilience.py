"""Surviving a lost PostgreSQL connection: the pipeline reconnects with backoff and resumes from the slot."""

from __future__ import annotations

import psycopg
import pytest

from cdc.errors import parse_lsn
from tests.plugins.pipeline import Outbox, topic_size, wait_until


def ids_of(records) -> list[str]:
    return [r.headers["id"].decode() for r in records]


def test_lost_replication_connection_is_retried_and_nothing_is_lost(
    outbox, pipeline_process, consume, kafka_bootstrap, pg_admin_dsn
):
    # Enough that the cut comes mid-stream at the pipeline's speed (it drained 20,000 before the first cut
    # at 150,000 events/s): the confirmed LSN that the cut waits for lags what was read.
    total, per_txn = 100_000, 100
    txns = outbox.bulk(total, per_transaction=per_txn, aggregates=100)
    proc = pipeline_process(CDC_BACKOFF_INITIAL="0.2", CDC_BACKOFF_MAX="1")
    wait_until(lambda: outbox.confirmed_lsn() > txns[20].lsn_before, 60, "20 transactions confirmed", 0.02)
    assert outbox.confirmed_lsn() < txns[-1].lsn_before, (
        "the pipeline was done before the cut: nothing tested"
    )

    # Cut the walsender twice: the pipeline must reconnect each time, with a log line per attempt.
    for _ in range(2):
        walsender = wait_until(outbox.slot_active_pid, 30, "a walsender on the slot")
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (walsender,))
        wait_until(lambda w=walsender: outbox.slot_active_pid() not in (None, w), 30, "a new walsender")

    wait_until(lambda: outbox.confirmed_lsn() > txns[-1].lsn_before, 120, "all transactions confirmed")
    assert proc.alive(), proc.tail()
    log = proc.log()
    assert log.count("reconnecting in") >= 2, proc.tail()
    assert "(reconnected)" in log

    topic = outbox.topic("order")
    size = topic_size(kafka_bootstrap, topic)
    records = consume(topic, size, timeout=120)
    got = ids_of(records)
    expected = outbox.ids()
    assert len(expected) == total
    assert not expected - set(got), f"{len(expected - set(got))} events lost across the reconnects"
    assert set(got) <= expected
    assert proc.terminate() == 0, proc.tail()


def test_timed_out_delivery_stops_with_exit_1_without_confirming_past_it(
    outbox, private_kafka, pipeline_process
):
    """Kafka gone for longer than delivery_timeout: one clear line, exit 1, the slot stays before the
    events Kafka never acknowledged; a restart (with the broker back) delivers them."""
    proc = pipeline_process(CDC_KAFKA_BOOTSTRAP_SERVERS=private_kafka.bootstrap, CDC_DELIVERY_TIMEOUT="3")
    proc.wait_streaming()
    first = outbox.commit([outbox.event("agg-1")])
    topic = outbox.topic("order")
    assert len(private_kafka.consume(topic, 1, timeout=60)) == 1
    wait_until(lambda: outbox.confirmed_lsn() >= first.lsn_after, 30, "the first event to be confirmed")

    private_kafka.stop()
    lost = outbox.commit([outbox.event("agg-1"), outbox.event("agg-2")])
    assert proc.wait(timeout=60) == 1, proc.tail()
    errors = [line for line in proc.log().splitlines() if line.startswith("cdc: error:")]
    assert len(errors) == 1, proc.tail()
    assert "Kafka refused an event of transaction" in errors[0]
    assert "without confirming past it" in errors[0]
    assert outbox.confirmed_lsn() < lost.lsn_after

    private_kafka.start()
    proc2 = pipeline_process(CDC_KAFKA_BOOTSTRAP_SERVERS=private_kafka.bootstrap)
    proc2.wait_streaming()
    records = private_kafka.consume(topic, 3, timeout=60)
    assert set(lost.ids) <= {r.headers["id"].decode() for r in records}
    wait_until(lambda: outbox.confirmed_lsn() >= lost.lsn_after, 30, "the redelivered events to be confirmed")
    assert proc2.terminate() == 0


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_the_saved_position_is_written_at_shutdown(outbox: Outbox, pipeline_process, unique_name, delivery):
    """A clean stop confirms what Kafka acknowledged to the slot, and saves it for `cdc recover` too: the
    saved position is otherwise up to status_interval behind, which a lost slot pays in duplicates."""
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    proc = pipeline_process(
        CDC_STATUS_INTERVAL="20",
        CDC_DELIVERY=delivery,
        CDC_CHECKPOINT_TOPIC=checkpoints,
    )
    proc.wait_streaming()
    first = outbox.commit([outbox.event("s-1")])
    wait_until(lambda: outbox.confirmed_lsn() >= first.lsn_after, 30, "the first event confirmed")
    last = outbox.commit([outbox.event("s-2")])
    wait_until(lambda: outbox.received_lsn() >= last.lsn_after, 30, "the last event read")
    assert proc.terminate() == 0, proc.tail()
    row = outbox.conn.execute(
        "SELECT confirmed_lsn::text, commit_time FROM public.cdc_checkpoint WHERE slot = %s", (outbox.slot,)
    ).fetchone()
    assert row is not None and row[0] is not None, "no position saved"
    assert parse_lsn(row[0]) == outbox.confirmed_lsn() >= last.lsn_after - 1, (row, outbox.slot_lsns())
    assert row[1] >= last.created_at, (row, last.created_at)
