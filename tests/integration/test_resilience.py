"""Surviving a lost PostgreSQL connection: the pipeline reconnects with backoff and resumes from the slot."""

from __future__ import annotations

import psycopg

from tests.plugins.pipeline import topic_size, wait_until


def ids_of(records) -> list[str]:
    return [r.headers["id"].decode() for r in records]


def test_lost_replication_connection_is_retried_and_nothing_is_lost(
    outbox, pipeline_process, consume, kafka_bootstrap, pg_admin_dsn
):
    total, per_txn = 20_000, 100
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
