"""Pruning a partitioned outbox or processed_events table: a ctid names a row only within one partition, so
the old rows of one partition must not take with them the young rows of another one at the same ctids."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from cdc.config import TableRef
from cdc.config_loader import load_settings
from cdc.consumer import processed
from cdc.ops import retention

OLD, YOUNG = 3, 5


@pytest.fixture
def partitioned(pg_conn, unique_name):
    """Create a table ``PARTITION BY <how>`` with the partitions ``<name>_old`` and ``<name>_new``."""

    def create(columns: str, how: str, old: str, new: str) -> str:
        name = unique_name("part")[:55]
        table = sql.Identifier(name)
        pg_conn.execute(sql.SQL("CREATE TABLE {} ({}) PARTITION BY " + how).format(table, sql.SQL(columns)))
        for suffix, bounds in (("old", old), ("new", new)):
            pg_conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES " + bounds).format(
                    sql.Identifier(f"{name}_{suffix}"), table
                )
            )
        return name

    return create


def rows(conn: psycopg.Connection, name: str, column: str) -> list[tuple[str, str, str]]:
    """(partition, ctid, first column) of every row, to see what survived and where it was."""
    return conn.execute(
        sql.SQL("SELECT tableoid::regclass::text, ctid::text, {} FROM {} ORDER BY 1, 2").format(
            sql.Identifier(column), sql.Identifier(name)
        )
    ).fetchall()


def assert_same_ctids(before: list[tuple[str, str, str]], name: str) -> None:
    # The point of the test: old and young rows at the same ctids, in different partitions.
    old = [ctid for part, ctid, _ in before if part == f"{name}_old"]
    young = [ctid for part, ctid, _ in before if part == f"{name}_new"]
    assert len(old) == OLD and young[:OLD] == old


def test_outbox_prune_on_a_partitioned_table_keeps_young_rows_at_the_same_ctid(
    pg_database, pg_conn, partitioned
):
    name = partitioned(
        "id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,"
        " event_type text NOT NULL, schema_version int NOT NULL DEFAULT 1, headers jsonb NULL,"
        " created_at timestamptz NOT NULL DEFAULT now(), payload jsonb NOT NULL,"
        " PRIMARY KEY (id, created_at)",
        "RANGE (created_at)",
        "FROM (MINVALUE) TO ('2000-01-01')",
        "FROM ('2000-01-01') TO (MAXVALUE)",
    )
    insert = sql.SQL(
        "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, created_at, payload)"
        " VALUES (%s, 'order', %s, 'OrderPlaced', %s, '{{}}')"
    ).format(sql.Identifier(name))
    young = [str(uuid.uuid4()) for _ in range(YOUNG)]
    for i in range(OLD):
        pg_conn.execute(insert, (uuid.uuid4(), f"old-{i}", "1999-06-01"))
    for i, event_id in enumerate(young):
        pg_conn.execute(insert, (event_id, f"young-{i}", "now"))
    before = rows(pg_conn, name, "id")
    assert_same_ctids(before, name)

    settings = load_settings(
        config_file=None, environ={}, overrides={"database_url": pg_database, "table": f"public.{name}"}
    )
    deleted = retention.prune(settings, timedelta(days=1), batch_size=2)

    after = rows(pg_conn, name, "id")
    assert sorted(str(r[2]) for r in after) == sorted(young), "only the old partition's rows are pruned"
    assert deleted == OLD


def test_processed_prune_on_a_partitioned_table_keeps_young_rows_at_the_same_ctid(
    pg_database, pg_conn, partitioned
):
    # Two services sharing one table, a partition each. (Not by range of processed_at: the primary key would
    # have to include it, and a redelivery, with a new processed_at, would no longer conflict.)
    name = partitioned(
        "event_id text NOT NULL, consumer text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (event_id, consumer)",
        "LIST (consumer)",
        "IN ('mailer')",
        "IN ('invoices')",
    )
    insert = sql.SQL("INSERT INTO {} (event_id, consumer, processed_at) VALUES (%s, %s, %s)").format(
        sql.Identifier(name)
    )
    young = [f"young-{i}" for i in range(YOUNG)]
    for i in range(OLD):
        pg_conn.execute(insert, (f"old-{i}", "mailer", "1999-06-01"))
    for event_id in young:
        pg_conn.execute(insert, (event_id, "invoices", "now"))
    assert_same_ctids(rows(pg_conn, name, "event_id"), name)

    table = TableRef(schema="public", name=name)
    deleted = processed.prune(pg_database, timedelta(days=7), table=table, batch_size=2)
    assert sorted(r[2] for r in rows(pg_conn, name, "event_id")) == young
    assert deleted == OLD

    # Only one consumer's rows: the other partition's rows at the same ctids are not that consumer's either.
    for i in range(OLD):
        pg_conn.execute(insert, (f"old-again-{i}", "mailer", "1999-06-01"))
    assert processed.prune(pg_database, timedelta(days=7), table=table, consumer="mailer") == OLD
    assert sorted(r[2] for r in rows(pg_conn, name, "event_id")) == young

    # What a lost guard row would mean: a redelivery of a young event would run its handler again.
    with pg_conn.transaction():
        assert processed.mark_many(pg_conn, table, young, "invoices") == set()
        raise psycopg.Rollback()
