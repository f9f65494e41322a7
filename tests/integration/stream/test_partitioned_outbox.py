"""A partitioned outbox, as the README recommends at high volume (issue 30, item 11): `cdc setup` publishes
it through its root, `cdc run` streams it, `cdc outbox prune --drop-partitions` drops old partitions and notes
what it dropped, and `cdc recover` works on it."""

from __future__ import annotations

import dataclasses

import pytest
from psycopg import sql

from cdc.config import TableRef
from tests.integration.stream.test_exactly_once import ids, read_all
from tests.integration.stream.test_pipeline import error_line
from tests.plugins.pipeline import Outbox, cdc, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def partitioned(outbox: Outbox) -> Outbox:
    """The outbox fixture's names, but a table partitioned by day on created_at, made before `cdc setup`
    (which leaves an existing table as it is): ten days ago, today, tomorrow."""
    name = outbox.table[:50] + "_p"
    table = sql.Identifier(name)
    outbox.conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,"
            " event_type text NOT NULL, schema_version int NOT NULL DEFAULT 1, headers jsonb NULL,"
            " created_at timestamptz NOT NULL DEFAULT now(), payload jsonb NOT NULL,"
            " PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)"
        ).format(table)
    )
    for suffix, start, end in (("old", -10, -9), ("today", 0, 1), ("tomorrow", 1, 2)):
        outbox.conn.execute(
            sql.SQL(
                "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM (date_trunc('day', now()) + {}::interval)"
                " TO (date_trunc('day', now()) + {}::interval)"
            ).format(
                sql.Identifier(f"{name}_{suffix}"),
                table,
                sql.Literal(f"{start} days"),
                sql.Literal(f"{end} days"),
            )
        )
    settings = dataclasses.replace(outbox.settings, table=TableRef(schema="public", name=name))
    box = dataclasses.replace(outbox, settings=settings, env={**outbox.env, "CDC_TABLE": f"public.{name}"})
    # The outbox fixture's own publication and slot are made for its plain table: start afresh.
    assert cdc(box.env, "teardown", "--yes").returncode == 0
    setup = cdc(box.env, "setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    return box


def test_a_partitioned_outbox_streams_prunes_by_partition_and_recovers(
    partitioned: Outbox, pipeline_process, kafka_bootstrap
):
    box = partitioned
    via_root = box.conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (box.settings.publication,)
    ).fetchone()
    assert via_root == (True,)
    proc = pipeline_process(**box.env)
    proc.wait_streaming()
    for n in range(5):
        box.commit([box.event(f"part-{n}-{i}") for i in range(4)])
    old = box.event("very-old")
    box.commit([old])
    box.conn.execute(
        sql.SQL("UPDATE {} SET created_at = now() - interval '10 days' WHERE id = %s").format(
            sql.Identifier(box.table)
        ),
        (old.id,),
    )  # moves it to the partition of ten days ago
    wait_until(lambda: box.confirmed_lsn() >= box.transactions[-1].lsn_after, 30, "the slot confirmed")
    records = read_all(kafka_bootstrap, box.topic("order"))
    assert set(ids(records)) == box.ids(), "every row of every partition arrived"
    assert {r.key().decode() for r in records} >= {"part-0-0", "very-old"}
    assert proc.terminate() == 0

    pruned = cdc(box.env, "outbox", "prune", "--older-than", "7d", "--drop-partitions")
    assert pruned.returncode == 0, pruned.stderr
    assert f"{box.table}_old" in pruned.stdout
    assert old.id not in box.ids()
    mark = box.conn.execute(
        "SELECT pruned_until IS NOT NULL FROM public.cdc_checkpoint WHERE slot = %s", (box.slot,)
    ).fetchone()
    assert mark == (True,), "the drop is noted for cdc recover"

    late = box.commit([box.event(f"late-{i}") for i in range(3)])  # committed, never delivered
    box.conn.execute("SELECT pg_drop_replication_slot(%s)", (box.slot,))
    # The dropped partition's row was committed a moment ago, after the start point: recover says so.
    refused = cdc(box.env, "recover", "--yes")
    assert refused.returncode == 2 and "`cdc outbox prune` deleted outbox rows" in error_line(refused.stderr)
    done = cdc(box.env, "recover", "--yes", "--accept-gap")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = set(ids(read_all(kafka_bootstrap, box.topic("order"))))
    assert {e.id for e in late.events} <= seen
    again = pipeline_process(**box.env)
    again.wait_streaming()
    fresh = box.commit([box.event("after")])
    wait_until(
        lambda: box.confirmed_lsn() >= fresh.lsn_after, 30, "the new slot streams the partitioned table"
    )
    assert fresh.events[0].id in set(ids(read_all(kafka_bootstrap, box.topic("order"))))
    assert again.terminate() == 0


def test_a_publication_without_publish_via_partition_root_is_refused_with_a_fix_that_works(
    partitioned: Outbox,
):
    box = partitioned
    publication = box.settings.publication
    box.conn.execute(
        sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = false)").format(
            sql.Identifier(publication)
        )
    )
    refused = cdc(box.env, "run")
    assert refused.returncode == 2
    message = error_line(refused.stderr)
    assert "is partitioned" in message and "publish_via_partition_root = true" in message
    fix = message[message.index("ALTER PUBLICATION") : message.index("; (")]
    box.conn.execute(fix)
    # setup would have fixed it too
    assert box.conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (publication,)
    ).fetchone() == (True,)


def test_drop_partitions_audited_refuses_a_partition_holding_a_row_the_last_audit_could_not_see(
    partitioned: Outbox,
):
    """Issue 42, item 2: a row created before audited_until, but written by a transaction not older than
    the audit's xmin (open while it looked), keeps its partition until the next audit judged it."""
    box = partitioned
    old = box.event("old")
    box.commit([old])
    with box.conn.transaction():
        box.conn.execute(
            sql.SQL("UPDATE {} SET created_at = now() - interval '10 days' WHERE id = %s").format(
                sql.Identifier(box.table)
            ),
            (old.id,),
        )  # into the partition of ten days ago, written by this transaction
        row = box.conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    xid = int(row[0])
    mark = (
        "UPDATE public.cdc_checkpoint SET audited_until = now(), audited_xmin = %s::text::xid8 "
        "WHERE slot = %s"
    )
    box.conn.execute(mark, (str(xid), box.slot))  # an audit that looked while that transaction ran
    refused = cdc(box.env, "outbox", "prune", "--older-than", "7d", "--drop-partitions", "--audited")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"partition {box.table}_old holds 1 rows" in refused.stderr, refused.stderr
    assert old.id in box.ids()

    box.conn.execute(mark, (str(xid + 1), box.slot))  # an audit that looked after it
    dropped = cdc(box.env, "outbox", "prune", "--older-than", "7d", "--drop-partitions", "--audited")
    assert dropped.returncode == 0, dropped.stderr
    assert old.id not in box.ids()
