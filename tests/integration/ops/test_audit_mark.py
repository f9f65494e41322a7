"""The audit's mark on a server of its own (cdc.ops.audit_mark): a prepared transaction and a transaction of
another database open while an audit looks hold its xmin back, a row written under either is left to the next
audit and kept by `cdc outbox prune --audited`, and a row's 32-bit xmin widens to the transaction's 64-bit
id in an epoch past the first."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc.config import Settings
from cdc.ops import audit_mark, retention
from tests.plugins.pgcluster import extra_cluster
from tests.plugins.pipeline import Outbox, cdc

pytestmark = pytest.mark.integration

EPOCH = 3


@pytest.fixture(scope="module")
def two_phase_cluster() -> Iterator[str]:
    with extra_cluster(
        xid_epoch=EPOCH, wal_level="logical", max_prepared_transactions="4", track_commit_timestamp="on"
    ) as dsn:
        yield dsn


def _insert(conn: psycopg.Connection[Any], table: str) -> tuple[str, int]:
    """A row in the transaction open on ``conn``; its id and the transaction's 64-bit id."""
    event_id = str(uuid.uuid4())
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
            " VALUES (%s, 'order', 'a-1', 'OrderPlaced', 1, '{{}}'::jsonb)"
        ).format(sql.Identifier(table)),
        (event_id,),
    )
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return event_id, int(row[0])


def _ids(conn: psycopg.Connection[Any], table: str) -> set[str]:
    rows = conn.execute(sql.SQL("SELECT id::text FROM {}").format(sql.Identifier(table))).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize(
    ("xid", "after", "widened"),
    [
        (50, (3 << 32) | 100, (3 << 32) | 50),
        (100, (3 << 32) | 100, (3 << 32) | 100),
        (200, (3 << 32) | 100, (2 << 32) | 200),  # before the epoch's wrap
        (2, (3 << 32) | 100, 0),  # frozen
        (200, 100, 200),  # after the snapshot, in the first epoch: never taken for an old one
    ],
)
def test_a_32_bit_xid_widens_to_the_latest_not_after_the_snapshot(pg_database, xid, after, widened):
    with psycopg.connect(pg_database, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT {}").format(
                audit_mark.widen(sql.SQL("%(xid)s::text::xid"), sql.SQL("%(after)s::bigint"))
            ),
            {"xid": str(xid), "after": after},
        ).fetchone()
    assert row is not None and row[0] == widened


def test_open_transactions_of_any_kind_are_left_to_the_next_audit(outbox: Outbox, two_phase_cluster: str):
    env = {**outbox.env, "CDC_DATABASE_URL": two_phase_cluster}
    setup = cdc(env, "setup")
    assert setup.returncode == 0, setup.stderr
    settings: Settings = dataclasses.replace(outbox.settings, database_url=two_phase_cluster)
    table = outbox.table
    other_db = f"other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(two_phase_cluster, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other_db)))
        with conn.transaction():
            before, before_xid = _insert(conn, table)
        widened = conn.execute(
            sql.SQL("SELECT {} FROM {} WHERE id = %s").format(audit_mark.FULL_XID, sql.Identifier(table)),
            (before,),
        ).fetchone()
        assert widened is not None and widened[0] == before_xid and before_xid >> 32 == EPOCH

        other = psycopg.connect(two_phase_cluster.rsplit("/", 1)[0] + f"/{other_db}")
        prepared = psycopg.connect(two_phase_cluster)
        try:
            # Another database's transaction holds an id; a prepared transaction holds a row of the outbox.
            row = other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            assert row is not None
            other_xid = int(row[0])
            in_prepared, prepared_xid = _insert(prepared, table)
            prepared.execute("PREPARE TRANSACTION 'cdc-audit-mark'")
            prepared.close()
            time.sleep(1.1)

            # What an audit notes: its snapshot's xmin is the other database's transaction's id.
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                scope = audit_mark.scope(conn, settings, datetime.now().astimezone() - timedelta(hours=1))
                seen = _ids(conn, table)
            assert scope.joins and scope.xmin == other_xid < prepared_xid
            assert seen == {before}  # the prepared row is invisible to the audit
            mark = audit_mark.note(conn, settings, datetime.now().astimezone(), scope)
            assert mark is not None
        finally:
            other.close()
        conn.execute("COMMIT PREPARED 'cdc-audit-mark'")

        # The prepared row, committed now, was created before the mark: a prune of what the mark covers (up to
        # a second before it) keeps it.
        assert retention.prune(settings, timedelta(seconds=1), audited=True) == 1
        assert _ids(conn, table) == {in_prepared}

        # The next audit carries it: created before its window, written by a transaction not older than
        # the noted xmin.
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            after = audit_mark.scope(conn, settings, mark)
            carried = after.carried(sql.Identifier("created_at"), mark)
            assert carried is not None
            rows = conn.execute(
                sql.SQL("SELECT id::text FROM {} WHERE {}").format(sql.Identifier(table), carried[0]),
                carried[1],
            ).fetchall()
        assert [r[0] for r in rows] == [in_prepared]
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(other_db)))
