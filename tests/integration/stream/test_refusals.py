"""Refusals before streaming that need a setup of their own: a slot in use, a publication that does not cover
the outbox, and a slot PostgreSQL invalidated (guarantee 6: never a silent re-creation)."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.integration.stream.test_pipeline import error_line, run_refused
from tests.plugins.pgcluster import extra_cluster
from tests.plugins.pipeline import cdc, own_cluster_env, wait_until
from tests.plugins.postgres import invalidate_slot

pytestmark = pytest.mark.core


def test_slot_in_use_by_another_pipeline_is_refused(outbox, pipeline_process):
    first = pipeline_process()
    first.wait_streaming()
    code, stderr, _ = run_refused(outbox.env)
    assert code == 2, stderr
    assert error_line(stderr).startswith(f"cdc: error: replication slot '{outbox.slot}' is in use by another")
    assert first.alive(), "the running pipeline must not be disturbed"
    assert first.terminate() == 0


def test_publication_that_does_not_cover_the_outbox_is_refused(outbox, unique_name):
    other = unique_name("pub")[:63]
    outbox.conn.execute(sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(other)))
    try:
        code, stderr, _ = run_refused(dict(outbox.env, CDC_PUBLICATION=other))
    finally:
        outbox.conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(other)))
    assert code == 2, stderr
    line = error_line(stderr)
    assert f"publication '{other}' does not publish inserts of public.{outbox.table}" in line
    assert "ALTER PUBLICATION" in line


def test_invalidated_slot_is_refused_and_not_recreated(outbox, pg_admin_dsn, unique_name, pg_major):
    """A slot whose WAL is gone (wal_status = lost): `cdc run` refuses and leaves it for a human."""
    invalidate_slot(pg_admin_dsn, outbox.dsn, outbox.slot, unique_name("filler")[:63])

    code, stderr, _ = run_refused(outbox.env)
    assert code == 2, stderr
    line = error_line(stderr)
    # PostgreSQL 17 names the reason.
    why = "invalidation_reason = wal_removed" if pg_major >= 17 else "wal_status = lost"
    assert f"replication slot '{outbox.slot}' was invalidated by PostgreSQL ({why})" in line

    status = cdc(outbox.env, "status")
    assert status.returncode == 2, "cdc status must alert on a lost slot"
    assert "wal status             lost" in status.stdout
    assert f"replication slot '{outbox.slot}' was invalidated" in error_line(status.stderr)
    row = outbox.conn.execute(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (outbox.slot,)
    ).fetchone()
    assert row == ("lost",), "the lost slot must be left as it is, never re-created"


@pytest.mark.pg(min=18)
def test_a_slot_invalidated_for_idleness_is_refused_with_its_reason(unique_name, kafka_bootstrap):
    """PostgreSQL 18's idle_replication_slot_timeout invalidates a slot that nothing streamed from: a new
    invalidation_reason (idle_timeout), with wal_status = lost and the restart_lsn kept."""
    with extra_cluster(wal_level="logical", idle_replication_slot_timeout="1s") as dsn:
        env = own_cluster_env(dsn, kafka_bootstrap, unique_name)
        assert cdc(env, "setup").returncode == 0
        with psycopg.connect(dsn, autocommit=True) as conn:

            def idle_out() -> str | None:
                conn.execute("CHECKPOINT")  # the server checks for idle slots at checkpoints
                row = conn.execute(
                    "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = %s",
                    (env["CDC_SLOT"],),
                ).fetchone()
                return None if row is None else row[0]

            time.sleep(1.5)
            assert wait_until(idle_out, 30, "the idle slot to be invalidated", interval=0.5) == "idle_timeout"
        code, stderr, _ = run_refused(env)
        assert code == 2, stderr
        assert "was invalidated by PostgreSQL (invalidation_reason = idle_timeout)" in error_line(stderr)
        status = cdc(env, "status", "--json")
        assert status.returncode == 2
        assert json.loads(status.stdout)["invalidation_reason"] == "idle_timeout"


def test_a_database_that_does_not_answer_yet_is_waited_for_at_start_then_refused(
    outbox, pipeline_process, consume, tcp_proxy
):
    """PostgreSQL restarting (or being promoted) when `cdc run` starts: the start waits for it, as for Kafka,
    then streams; one that does not answer within startup_timeout is a refusal, exit 1 with the reason."""
    params = conninfo_to_dict(outbox.settings.database_url)
    proxy = tcp_proxy(str(params["host"]), int(params["port"]))
    proxy.stop()  # connection refused, as while the server is down
    dsn = make_conninfo(outbox.settings.database_url, port=str(proxy.port))
    quick = {"CDC_DATABASE_URL": dsn, "CDC_BACKOFF_INITIAL": "0.2", "CDC_BACKOFF_MAX": "0.5"}
    proc = pipeline_process(**quick)
    proc.wait_for_log(r"PostgreSQL: cannot connect to PostgreSQL: .*; the start waits for it \(attempt 2", 30)
    proxy.start()
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("w-1")])
    assert [r.headers["id"].decode() for r in consume(outbox.topic("order"), 1)] == txn.ids
    assert proc.terminate() == 0

    proxy.stop()
    started = time.monotonic()
    late = pipeline_process(**quick, CDC_STARTUP_TIMEOUT="3")
    assert late.wait(30) == 1
    assert 3 <= time.monotonic() - started < 20
    line = error_line(late.log())
    assert line.startswith("cdc: error: cannot connect to PostgreSQL:"), line
    assert str(params["password"]) not in late.log()
