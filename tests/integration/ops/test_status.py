"""`cdc status` and `cdc teardown` against the real database."""

from __future__ import annotations

import json

import pytest

from tests.integration.stream.test_pipeline import error_line
from tests.plugins.pipeline import cdc, wait_until

pytestmark = pytest.mark.core


def test_status_reports_the_slot_lag_and_the_outbox(outbox, pipeline_process, pg_major):
    outbox.commit([outbox.event("s-1"), outbox.event("s-1")])
    done = cdc(outbox.env, "status", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["slot"] == outbox.slot and report["present"] is True and report["active"] is False
    assert report["wal_status"] in {"reserved", "extended"}
    assert report["outbox_rows"] == 2
    assert report["oldest_row_age_s"] >= 0
    assert report["lag_bytes"] > 0, "two events are not streamed yet: the slot lags"
    assert report["retained_wal_bytes"] >= report["lag_bytes"]
    assert report["server_version"].startswith(str(pg_major))
    # PostgreSQL 17 says since when an unused slot is idle, and whether it is a failover slot.
    assert (report["inactive_since"] is not None) is (pg_major >= 17)
    assert report["failover"] is (False if pg_major >= 17 else None)
    assert report["invalidation_reason"] is None

    proc = pipeline_process()
    proc.wait_streaming()
    wait_until(
        lambda: outbox.confirmed_lsn() >= outbox.transactions[-1].lsn_after, 30, "the events confirmed"
    )
    streaming = json.loads(cdc(outbox.env, "status", "--json").stdout)
    assert streaming["active"] is True and streaming["active_pid"] == outbox.slot_active_pid()
    assert streaming["lag_bytes"] < report["lag_bytes"]
    assert streaming["inactive_since"] is None
    table = cdc(outbox.env, "status")
    assert table.returncode == 0
    assert f"slot                   {outbox.slot}" in table.stdout
    assert "active                 true" in table.stdout
    assert proc.terminate() == 0


def test_status_of_a_missing_slot_exits_non_zero_after_the_report(outbox):
    env = dict(outbox.env, CDC_SLOT="no_such_slot_here")
    done = cdc(env, "status")
    assert done.returncode == 2
    assert "present                false" in done.stdout
    assert error_line(done.stderr).startswith(
        "cdc: error: replication slot 'no_such_slot_here' does not exist"
    )


def test_teardown_refuses_while_streaming_then_drops_slot_and_publication(outbox, pipeline_process):
    proc = pipeline_process()
    proc.wait_streaming()
    refused = cdc(outbox.env, "teardown", "--yes")
    assert refused.returncode == 2
    assert "is in use by pid" in error_line(refused.stderr)
    assert proc.terminate() == 0

    wait_until(lambda: outbox.slot_active_pid() is None, 30, "the slot to be released")
    asked = cdc(outbox.env, "teardown")  # no --yes and no answer on stdin: nothing is dropped
    assert asked.returncode != 0
    assert outbox.conn.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (outbox.slot,)
    ).fetchone() == (1,)

    done = cdc(outbox.env, "teardown", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"dropped slot {outbox.slot}",
        f"forgot the saved position of slot {outbox.slot}",  # `cdc setup` noted the slot's creation
        f"dropped publication {outbox.settings.publication}",
    ]
    left = outbox.conn.execute(
        "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s),"
        " (SELECT count(*) FROM pg_publication WHERE pubname = %s)",
        (outbox.slot, outbox.settings.publication),
    ).fetchone()
    assert left == (0, 0)
    assert cdc(outbox.env, "teardown", "--yes").stdout.splitlines()[0] == f"slot {outbox.slot} was not there"
