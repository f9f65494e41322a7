"""`cdc recover` against the real stack: a slot lost under load (dropped, or invalidated by PostgreSQL) is
re-created, the rows it may not have delivered are republished from the outbox table in the new slot's
snapshot, and after `cdc run` starts again not one event is missing. Also its refusals, and a recover that
did not finish."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from tests.integration.stream.test_pipeline import error_line
from tests.plugins.pgcluster import extra_cluster
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


def test_a_young_table_whose_slot_acknowledged_nothing_recovers_from_where_setup_made_the_slot(
    outbox: Outbox, consume
):
    """Issue 25: a slot dropped minutes after `cdc setup`, every row still in the table, was refused as
    "pruned past the start point" (its oldest row younger than the saved time minus the margin). Nothing
    was pruned: the slot's creation, which setup notes, is where its events begin."""
    events = outbox.commit([outbox.event(f"y-{i}") for i in range(5)]).events
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    missing = cdc(outbox.env, "run")
    assert missing.returncode == 2
    assert "run `cdc recover`" in error_line(missing.stderr)
    done = cdc(outbox.env, "recover", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the slot acknowledged nothing; it was created" in done.stdout
    records = consume(outbox.topic("order"), 5, timeout=30)
    assert {r.headers["id"].decode() for r in records} == {e.id for e in events}


def test_a_recover_that_did_not_finish_is_refused_by_run_and_done_again(
    outbox: Outbox, pipeline_process, consume
):
    events = outbox.commit([outbox.event(f"u-{i}") for i in range(5)]).events
    # A recover that died after creating the slot: the mark is set, the slot is there.
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    outbox.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (outbox.slot,))
    outbox.conn.execute(
        "UPDATE public.cdc_checkpoint SET recovering_since = now() WHERE slot = %s", (outbox.slot,)
    )
    refused = cdc(outbox.env, "run")
    assert refused.returncode == 2
    assert "was re-created by a `cdc recover` that did not finish" in error_line(refused.stderr)

    done = cdc(outbox.env, "recover", "--yes", "--since", "1h")
    assert done.returncode == 0, done.stderr
    assert f"slot {outbox.slot}: unfinished" in done.stdout
    assert "republished 5 events" in done.stdout
    records = consume(outbox.topic("order"), 5, timeout=30)
    assert {r.headers["id"].decode() for r in records} == {e.id for e in events}
    assert all(r.headers["cdc_republished"].startswith(b"recover ") for r in records)
    proc = pipeline_process()
    proc.wait_streaming()
    assert proc.alive()


def _published_and_confirmed(outbox: Outbox, pipeline_process) -> None:
    """Stream until the slot confirmed every transaction so far and the position was saved; then stop."""
    proc = pipeline_process()
    proc.wait_streaming()
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed the events")
    wait_until(lambda: (saved_position(outbox) or (None, None))[1] is not None, 30, "a saved position")
    assert proc.terminate() == 0


def test_recover_finds_a_transaction_that_ran_longer_than_the_margin(
    outbox: Outbox, pipeline_process, consume
):
    """Scaled down from issue 30: margin 5 s, a transaction open 8 s across the point the lost slot had
    acknowledged. Its rows were created (now()) before that point minus the margin, but committed after it:
    chosen by created_at they were missed, and recover said it succeeded."""
    slow = psycopg.connect(outbox.dsn)
    with slow.transaction():
        long_txn = [outbox.event("long-1"), outbox.event("long-2")]
        outbox.insert_with(slow, long_txn)
        time.sleep(8)
        outbox.commit([outbox.event("short")])
        _published_and_confirmed(outbox, pipeline_process)  # the saved position is after "short"
    slow.close()  # committed now: after the saved position, never delivered by the slot about to be lost
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    done = cdc(outbox.env, "recover", "--yes", "--margin", "5s")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {r.headers["id"].decode() for r in consume(outbox.topic("order"), 10, timeout=15)}
    assert {e.id for e in long_txn} <= seen, "the long transaction's rows were not republished"


def test_a_prune_past_the_start_point_is_refused_even_when_older_rows_survive(
    outbox: Outbox, pipeline_process
):
    """Issue 30: the check read only min(created_at), so one older row that prune left (locked, or with a
    created_at of its writer's choosing) hid a prune of rows the lost slot had not delivered."""
    survivor = outbox.event("old")
    outbox.commit([survivor])
    outbox.conn.execute(
        psycopg.sql.SQL("UPDATE {} SET created_at = now() - interval '3 days' WHERE id = %s").format(
            psycopg.sql.Identifier(outbox.table)
        ),
        (survivor.id,),
    )
    outbox.commit([outbox.event(f"p-{i}") for i in range(3)])
    _published_and_confirmed(outbox, pipeline_process)
    outbox.commit([outbox.event(f"late-{i}") for i in range(3)])  # committed, not delivered
    outbox.conn.execute(
        psycopg.sql.SQL("UPDATE {} SET created_at = now() - interval '2 days' WHERE id <> %s").format(
            psycopg.sql.Identifier(outbox.table)
        ),
        (survivor.id,),
    )
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    locked = psycopg.connect(outbox.dsn)
    with locked.transaction():  # prune skips a locked row: the survivor stays, the rest goes
        locked.execute(
            psycopg.sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(
                psycopg.sql.Identifier(outbox.table)
            ),
            (survivor.id,),
        )
        pruned = cdc(outbox.env, "outbox", "prune", "--older-than", "1d")
    locked.close()
    assert pruned.returncode == 0, pruned.stderr
    assert outbox.ids() == {survivor.id}
    refused = cdc(outbox.env, "recover", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "`cdc outbox prune` deleted outbox rows" in error_line(refused.stderr)
    accepted = cdc(outbox.env, "recover", "--yes", "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr


def test_recover_without_commit_timestamps_says_what_it_cannot_prove(outbox: Outbox, kafka_bootstrap):
    with extra_cluster(wal_level="logical") as other:  # track_commit_timestamp off, as by default
        env = {**outbox.env, "CDC_DATABASE_URL": other}
        setup = cdc(env, "setup")
        assert setup.returncode == 0, setup.stderr
        assert "track_commit_timestamp is off" in setup.stderr and "ALTER SYSTEM SET" in setup.stderr
        with psycopg.connect(other, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
        refused = cdc(env, "recover", "--yes")
        assert refused.returncode == 2, refused.stderr
        message = error_line(refused.stderr)
        assert "track_commit_timestamp is off" in message and "longer than --margin" in message
        assert "ALTER SYSTEM SET track_commit_timestamp = on" in message
        done = cdc(env, "recover", "--yes", "--accept-gap")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "created (track_commit_timestamp is off)" in done.stdout


def test_a_prune_between_the_plan_and_the_new_slot_is_seen_in_its_snapshot(outbox: Outbox, pipeline_process):
    """The plan saw nothing pruned; a prune ran before recover created the slot. recover() reads the mark
    again inside the new slot's snapshot, refuses, and drops the slot it made."""
    from cdc.errors import RecoveryRefusedError
    from cdc.ops import recover, retention

    outbox.commit([outbox.event(f"p-{i}") for i in range(3)])
    _published_and_confirmed(outbox, pipeline_process)
    outbox.commit([outbox.event(f"late-{i}") for i in range(3)])  # committed, not delivered
    outbox.conn.execute(
        sql.SQL("UPDATE {} SET created_at = now() - interval '2 days'").format(sql.Identifier(outbox.table))
    )
    outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
    chosen = recover.plan(outbox.settings)
    assert chosen.rows == 3 + 3  # duplicates within the margin
    assert retention.prune(outbox.settings, timedelta(days=1)) == 6
    with pytest.raises(RecoveryRefusedError, match="`cdc outbox prune` deleted outbox rows"):
        recover.recover(outbox.settings, chosen)
    assert outbox.slot_active_pid() is None
    slots = outbox.conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (outbox.slot,))
    assert slots.fetchone() is None, "the new slot was not dropped after the refusal"
