"""Heartbeats while the outbox is idle: another database writes WAL steadily, the outbox gets nothing. With
the pipeline running, the slot's retained WAL stays bounded; with it stopped, it grows."""

from __future__ import annotations

import json
import logging
import time

import psycopg
import pytest
from psycopg import sql

from cdc.stream.heartbeat import LOCK_TIMEOUT_MS, Heartbeat, heartbeat_table
from tests.integration.test_metrics import get, metric
from tests.plugins.pipeline import cdc, free_port, wait_until

pytestmark = pytest.mark.core

MB = 1024 * 1024


def retained(outbox) -> int:
    _, restart = outbox.slot_lsns()
    return outbox.current_lsn() - restart


def write_wal(conn, megabytes: int) -> None:
    """About `megabytes` of WAL in another database, with checkpoints (they let restart_lsn move)."""
    for i in range(megabytes * 2):
        conn.execute("INSERT INTO noise SELECT g, repeat('x', 200) FROM generate_series(1, 1500) g")
        if i % 20 == 19:
            conn.execute("CHECKPOINT")
    conn.execute("CHECKPOINT")


def test_heartbeats_keep_an_idle_slot_moving_and_a_stopped_one_grows(
    outbox, pipeline_process, pg_connect, unique_name
):
    other = unique_name("noise")[:63]
    with pg_connect(autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other)))
    try:
        port = free_port()
        proc = pipeline_process(CDC_HEARTBEAT_INTERVAL="0.5", CDC_METRICS_PORT=str(port))
        proc.wait_streaming()
        with pg_connect(dbname=other, autocommit=True) as conn:
            conn.execute("CREATE TABLE noise (i int, pad text)")
            start = outbox.current_lsn()
            write_wal(conn, 64)
            written = outbox.current_lsn() - start
            assert written > 40 * MB

            def bounded() -> int | bool:
                conn.execute("CHECKPOINT")
                value = retained(outbox)
                return value < 16 * MB and value

            running = wait_until(bounded, 60, "the retained WAL to stay bounded while running", 1.0)
            wait_until(
                lambda: metric(get(port, "/metrics")[1], "cdc_heartbeats_seen_total") >= 3,
                10,
                "heartbeats every 0.5 s to come back on the stream",
            )
            assert metric(get(port, "/metrics")[1], "cdc_last_heartbeat_seen_timestamp_seconds") > 0
            report = json.loads(cdc(outbox.env, "status", "--json").stdout)
            assert report["last_heartbeat_seen"] is not None, "cdc status shows the last heartbeat seen"
            assert proc.terminate() == 0

            before = retained(outbox)
            write_wal(conn, 64)
            stopped = retained(outbox)
        print(
            f"\nretained WAL: {running / MB:.1f} MB with the pipeline running after {written / MB:.0f} MB "
            f"written; {before / MB:.1f} MB -> {stopped / MB:.1f} MB with it stopped"
        )
        assert stopped - before > 40 * MB, "with the pipeline stopped, the slot must hold the WAL back"
        assert running < stopped
    finally:
        with pg_connect(autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(other)))


def test_a_locked_heartbeat_table_costs_a_warning_within_the_lock_timeout_not_the_stream(outbox, caplog):
    """The heartbeat's statements run on the stream's only thread: a DBA's lock on cdc_heartbeat must not
    hold it longer than the heartbeat's lock_timeout."""
    beat = Heartbeat(outbox.settings)
    beat.emit(time.monotonic())  # opens the heartbeat's connection, with its timeouts
    with psycopg.connect(outbox.dsn) as locker:
        locker.execute(f"LOCK TABLE {heartbeat_table(outbox.settings)} IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="cdc.heartbeat"):
            beat.came_back()
        waited = time.monotonic() - started
        locker.rollback()
    beat.close()
    assert waited < LOCK_TIMEOUT_MS / 1000 + 2, f"the heartbeat waited {waited:.1f} s on a lock"
    assert "could not note the heartbeat" in caplog.text
