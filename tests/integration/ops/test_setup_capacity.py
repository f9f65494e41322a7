"""`cdc setup` checks for a free replication slot and WAL sender before it creates anything, and says the
exact ALTER SYSTEM line to run."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.integration.stream.test_pipeline import error_line, run_refused


@pytest.fixture
def tight_env(tight_cluster, unique_name) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_DATABASE_URL=tight_cluster,
        CDC_TABLE="public." + unique_name("outbox")[:50],
        CDC_SLOT=unique_name("slot")[:63],
        CDC_PUBLICATION=unique_name("pub")[:63],
    )
    return env


def test_setup_refuses_when_no_replication_slot_is_free(tight_cluster, tight_env, unique_name):
    other = unique_name("other")[:63]
    with psycopg.connect(tight_cluster, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (other,))
        try:
            code, stderr, _ = run_refused(tight_env, command="setup")
            slots = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
            table = conn.execute("SELECT to_regclass(%s)", (tight_env["CDC_TABLE"],)).fetchone()
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (other,))
    assert code == 2, stderr
    line = error_line(stderr)
    assert "no free replication slot (1 of max_replication_slots = 1 in use)" in line
    assert "ALTER SYSTEM SET max_replication_slots = 5; then restart PostgreSQL" in line
    assert slots == [(other,)]
    assert table == (None,), "nothing is created before the checks pass"


def test_setup_succeeds_on_the_same_server_once_a_slot_is_free(tight_cluster, tight_env):
    code, stderr, _ = run_refused(tight_env, command="setup")
    assert code == 0, stderr
    with psycopg.connect(tight_cluster, autocommit=True) as conn:
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (tight_env["CDC_SLOT"],))
    assert slots == [(tight_env["CDC_SLOT"],)]


@pytest.mark.core
@pytest.mark.pg(max=16)
def test_failover_slot_is_refused_before_postgresql_17(tight_cluster, tight_env, pg_major):
    code, stderr, _ = run_refused(tight_env, command="setup", args=["--failover"])
    assert code == 2, stderr
    assert f"failover slots need PostgreSQL 17 or later; this server is {pg_major}" in error_line(stderr)


@pytest.mark.core
@pytest.mark.pg(min=17)
def test_failover_slot_is_created_from_postgresql_17(tight_cluster, tight_env):
    code, stderr, _ = run_refused(tight_env, command="setup", args=["--failover"])
    assert code == 0, stderr
    with psycopg.connect(tight_cluster, autocommit=True) as conn:
        slots = conn.execute("SELECT slot_name, failover FROM pg_replication_slots").fetchall()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (tight_env["CDC_SLOT"],))
    assert slots == [(tight_env["CDC_SLOT"], True)]
