"""`cdc recover` against the real stack: a slot lost under load (dropped, or invalidated by PostgreSQL) is
re-created, the rows it may not have delivered are republished from the outbox table in the new slot's
snapshot, and after `cdc run` starts again not one event is missing. Also its refusals, and a recover that
did not finish."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from tests.integration.stream.test_pipeline import error_line
from tests.plugins.pipeline import Outbox, cdc, order_placed, wait_until
from tests.plugins.postgres import invalidate_slot

pytestmark = pytest.mark.integration


class Load:
    """Small outbox transactions committed in a thread, on a connection of its own, until stopped."""

    def __init__(self, outbox: Outbox, *, pause: float = 0.005) -> None:
        self.outbox = outbox
        self.pause = pause
        self.committed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise AssertionError(f"the load failed: {self.error!r}")

    def _run(self) -> None:
        insert = sql.SQL(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
            " VALUES (%s, 'order', %s, 'OrderPlaced', 1, %s::jsonb)"
        ).format(sql.Identifier(self.outbox.table))
        try:
            with psycopg.connect(self.outbox.dsn, autocommit=True) as conn:
                n = 0
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(3):
                            n += 1
                            conn.execute(insert, (str(uuid.uuid4()), f"agg-{n % 7}", _payload(n)))
                    self.committed += 3
                    time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc


def _payload(n: int) -> str:
    return json.dumps(order_placed(f"o-{n}", amount_cents=n))


def saved_position(outbox: Outbox):
    row = outbox.conn.execute(
        "SELECT confirmed_lsn::text, commit_time, recovering_since FROM public.cdc_checkpoint"
        " WHERE slot = %s",
        (outbox.slot,),
    ).fetchone()
    return row


def every_id_arrives(outbox: Outbox, consume, timeout: float = 120) -> None:
    """Read until every row of the outbox table is on its topic (duplicates are expected)."""
    topic = outbox.topic("order")
    expected = outbox.ids()
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not expected <= seen and time.monotonic() < deadline:
        seen = {r.headers["id"].decode() for r in consume(topic, 10 * len(expected), timeout=5)}
    missing = expected - seen
    assert not missing, f"{len(missing)} of {len(expected)} events missing after the recover"


def lose_slot_under_load(outbox: Outbox, pipeline_process, how, *, recover_args: list[str]) -> str:
    """Stream under load until a position is saved, kill -9 the pipeline, lose the slot (``how``), recover
    while the load goes on, stream again. Returns recover's output."""
    proc = pipeline_process()
    proc.wait_streaming()
    with Load(outbox) as load:
        wait_until(lambda: saved_position(outbox) is not None, 30, "the pipeline to save its position")
        time.sleep(4)  # a few more saves (the start point is the last one's minus --margin), and in flight
        proc.kill()
        wait_until(lambda: outbox.slot_active_pid() is None, 30, "the slot to be released")
        how()
        lost_at = load.committed
        time.sleep(1)  # events committed while no slot exists: only the table has them
        # Refused while it is not sure to find every row: the default margin reaches before the table.
        refused = cdc(outbox.env, "recover", "--yes")
        assert refused.returncode == 2, refused.stderr
        assert "was pruned past the start point" in error_line(refused.stderr)
        done = cdc(outbox.env, "recover", "--yes", *recover_args, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert load.committed > lost_at, "the load went on during the recover"
        time.sleep(1)  # and after it, before the pipeline starts again: the new slot has those
    restarted = pipeline_process()
    restarted.wait_streaming()
    return done.stdout


@pytest.mark.core  # CREATE_REPLICATION_SLOT's syntax differs before 15
def test_recover_after_the_slot_was_dropped_under_load_loses_nothing(
    outbox: Outbox, pipeline_process, consume
):
    def drop() -> None:
        outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
        # `cdc setup` would make a new slot at the current position, skipping what the lost one held.
        setup = cdc(outbox.env, "setup")
        assert setup.returncode == 2, setup.stdout + setup.stderr
        assert "it was lost, and a new slot made here would skip" in error_line(setup.stderr)

    out = lose_slot_under_load(outbox, pipeline_process, drop, recover_args=["--margin", "2s"])
    assert f"slot {outbox.slot}: missing" in out
    assert f"recovered slot {outbox.slot}: republished" in out
    every_id_arrives(outbox, consume)
    position = saved_position(outbox)
    assert position is not None and position[2] is None, "the recover mark is cleared"


def test_recover_after_postgres_invalidated_the_slot_loses_nothing(
    outbox: Outbox, pipeline_process, consume, pg_admin_dsn, unique_name
):
    def invalidate() -> None:
        invalidate_slot(pg_admin_dsn, outbox.dsn, outbox.slot, unique_name("filler")[:63])

    out = lose_slot_under_load(outbox, pipeline_process, invalidate, recover_args=["--margin", "2s"])
    assert f"slot {outbox.slot}: invalidated" in out
    every_id_arrives(outbox, consume)
    row = outbox.conn.execute(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (outbox.slot,)
    ).fetchone()
    assert row is not None and row[0] != "lost"


def test_recover_refuses_a_healthy_slot_and_a_slot_in_use(outbox: Outbox, pipeline_process):
    healthy = cdc(outbox.env, "recover", "--yes", "--since", "1h")
    assert healthy.returncode == 2
    assert f"replication slot '{outbox.slot}' is healthy: there is nothing to recover" in error_line(
        healthy.stderr
    )
    proc = pipeline_process()
    proc.wait_streaming()
    busy = cdc(outbox.env, "recover", "--yes", "--since", "1h")
    assert busy.returncode == 2
    assert f"replication slot '{outbox.slot}' is in use by pid" in error_line(busy.stderr)
    assert proc.alive()


def test_a_recover_that_did_not_finish_is_refused_by_run_and_done_again(
    outbox: Outbox, pipeline_process, consume
):
    events = outbox.commit([outbox.event(f"u-{i}") for i in range(5)]).events
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    missing = cdc(outbox.env, "run")
    assert missing.returncode == 2
    assert "run `cdc recover`" in error_line(missing.stderr)
    no_position = cdc(outbox.env, "recover", "--yes")
    assert no_position.returncode == 2
    assert "give the time to republish from with --since" in error_line(no_position.stderr)

    # A recover that died after creating the slot: the mark is set, the slot is there.
    outbox.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (outbox.slot,))
    outbox.conn.execute(
        "INSERT INTO public.cdc_checkpoint (slot, confirmed_lsn, commit_time, updated_at, recovering_since)"
        " VALUES (%s, '0/0', now(), now(), now())",
        (outbox.slot,),
    )
    refused = cdc(outbox.env, "run")
    assert refused.returncode == 2
    assert "was re-created by a `cdc recover` that did not finish" in error_line(refused.stderr)

    # The table is younger than an hour: nothing was pruned, which only the operator can know.
    gap = cdc(outbox.env, "recover", "--yes", "--since", "1h")
    assert gap.returncode == 2 and "--accept-gap" in error_line(gap.stderr)
    done = cdc(outbox.env, "recover", "--yes", "--since", "1h", "--accept-gap")
    assert done.returncode == 0, done.stderr
    assert f"slot {outbox.slot}: unfinished" in done.stdout
    assert "republished 5 events" in done.stdout
    records = consume(outbox.topic("order"), 5, timeout=30)
    assert {r.headers["id"].decode() for r in records} == {e.id for e in events}
    assert all(r.headers["cdc_republished"].startswith(b"recover ") for r in records)
    proc = pipeline_process()
    proc.wait_streaming()
    assert proc.alive()
