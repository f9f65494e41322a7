"""PostgreSQL fixtures: the admin DSN, a connection factory, a fresh database per test module, and unique
slot / publication / table names that are cleaned up after each test.

``@pytest.mark.pg(min=14)`` / ``@pytest.mark.pg(max=13)``: a test of a feature that exists only on some
PostgreSQL major versions runs only against those (``make test-matrix`` runs the suite on each)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.plugins.services import service_missing

PgConnect = Callable[..., psycopg.Connection[Any]]


@pytest.fixture(scope="session")
def pg_admin_dsn() -> str:
    """DSN of a role allowed to create databases and slots (the stack's superuser)."""
    dsn = os.environ.get("CDC_DATABASE_URL")
    if not dsn:
        service_missing("PostgreSQL is not configured: CDC_DATABASE_URL is not set")
        raise AssertionError("unreachable")
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            level = conn.execute("SHOW wal_level").fetchone()
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL does not answer at CDC_DATABASE_URL: {type(exc).__name__}")
        raise AssertionError("unreachable") from exc
    assert level is not None and level[0] == "logical", "the test cluster must run with wal_level = logical"
    return dsn


def dsn_for(dsn: str, **changes: Any) -> str:
    """The same DSN with some parameters changed, e.g. another dbname."""
    params = conninfo_to_dict(dsn)
    params.update(changes)
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def pg_connect(pg_admin_dsn: str) -> PgConnect:
    """Open a connection to the test cluster: `pg_connect(dbname=..., autocommit=True, replication=...)`."""

    def connect(dbname: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        dsn = dsn_for(pg_admin_dsn, dbname=dbname) if dbname else pg_admin_dsn
        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(dsn, **kwargs)

    return connect


def _drop_database(pg_connect: PgConnect, name: str) -> None:
    with pg_connect(autocommit=True) as conn:
        # A slot pins its database: drop the test's leftover slots before the database itself.
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def pg_database(pg_admin_dsn: str, pg_connect: PgConnect, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for the test module; yields its DSN and drops it (and its slots) afterwards."""
    module = request.module.__name__.rsplit(".", 1)[-1][:20]
    name = f"cdct_{module}_{uuid.uuid4().hex[:8]}"
    with pg_connect(autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    try:
        yield dsn_for(pg_admin_dsn, dbname=name)
    finally:
        _drop_database(pg_connect, name)


@pytest.fixture
def pg_conn(pg_database: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the module's database."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        yield conn


@pytest.fixture
def slot_name(unique_name: Callable[[str], str], pg_connect: PgConnect) -> Iterator[str]:
    """A unique replication slot name; the slot is dropped after the test if it exists."""
    name = unique_name("slot")[:63]
    yield name
    with pg_connect(autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL",
            (name,),
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (name,),
        )


@pytest.fixture
def publication_name(unique_name: Callable[[str], str]) -> str:
    """A unique publication name (publications live in the module's database, dropped with it)."""
    return unique_name("pub")[:63]


@pytest.fixture
def table_name(unique_name: Callable[[str], str]) -> str:
    """A unique table name in the module's database."""
    return unique_name("tbl")[:63]


@pytest.fixture(scope="session")
def pg_major(pg_admin_dsn: str) -> int:
    """The major version of the stack's server (13 to 18)."""
    with psycopg.connect(pg_admin_dsn, connect_timeout=5) as conn:
        return conn.info.server_version // 10000


@pytest.fixture(autouse=True)
def _pg_versions(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("pg")
    if marker is None:
        return
    major: int = request.getfixturevalue("pg_major")
    low, high = marker.kwargs.get("min", 0), marker.kwargs.get("max", 1000)
    if not low <= major <= high:
        pytest.skip(f"PostgreSQL {major}: this test is for {low}..{high if high < 1000 else ''}")


def invalidate_slot(admin_dsn: str, dsn: str, slot: str, filler: str, timeout: float = 60) -> None:
    """Make PostgreSQL invalidate the inactive ``slot`` (``wal_status = lost``): ``max_slot_wal_keep_size``
    lowered for a moment, and WAL written (into the new table ``filler``) and checkpointed past it."""
    from psycopg import sql

    from tests.plugins.pipeline import wait_until

    table = sql.Identifier(filler)
    with psycopg.connect(admin_dsn, autocommit=True) as admin, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (x text)").format(table))
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            # Move the WAL well past what the slot may keep, and let checkpoints remove the old segments.
            for _ in range(4):
                admin.execute("SELECT pg_switch_wal()")
                conn.execute(
                    sql.SQL("INSERT INTO {} SELECT repeat('x', 1000) FROM generate_series(1, 20000)").format(
                        table
                    )
                )
                admin.execute("CHECKPOINT")

            def lost() -> bool:
                admin.execute("SELECT pg_switch_wal()")
                admin.execute("CHECKPOINT")
                row = admin.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
                return row is not None and row[0] == "lost"

            wait_until(lost, timeout, "the slot to be invalidated", interval=0.5)
        finally:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")
            conn.execute(sql.SQL("DROP TABLE {}").format(table))
