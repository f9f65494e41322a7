"""`cdc run` and `cdc setup` against a real PostgreSQL that runs with ``wal_level = replica``: a plain
refusal (exit code 2, one ``cdc: error:`` line that names wal_level and the fix), and nothing created on the
server."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.integration.stream.test_pipeline import error_line, run_refused

pytestmark = pytest.mark.core

FIX = "ALTER SYSTEM SET wal_level = logical"


@pytest.fixture
def replica_env(replica_cluster: str, kafka_bootstrap: str) -> dict[str, str]:
    """The environment of a `cdc` subprocess pointed at the wal_level=replica cluster (and the real broker:
    `cdc run` checks Kafka before PostgreSQL)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CDC_")}
    env.update(
        CDC_DATABASE_URL=replica_cluster,
        CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        CDC_STARTUP_TIMEOUT="5",
    )
    return env


def server_objects(dsn: str) -> dict[str, list[str]]:
    """Everything `cdc setup` could have created: user tables, publications, replication slots."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        level = conn.execute("SHOW wal_level").fetchone()
        assert level == ("replica",), f"the test cluster must run with wal_level = replica, not {level}"
        tables = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
        ).fetchall()
        outbox = conn.execute("SELECT to_regclass('public.outbox')::text").fetchone()
        publications = conn.execute("SELECT pubname FROM pg_publication ORDER BY 1").fetchall()
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots ORDER BY 1").fetchall()
    return {
        "tables": [name for (name,) in tables] + ([outbox[0]] if outbox and outbox[0] else []),
        "publications": [name for (name,) in publications],
        "slots": [name for (name,) in slots],
    }


NOTHING = {"tables": [], "publications": [], "slots": []}


@pytest.mark.parametrize("command", ["run", "setup"])
def test_wal_level_replica_is_refused_with_the_fix(command, replica_cluster, replica_env):
    assert server_objects(replica_cluster) == NOTHING
    code, stderr, elapsed = run_refused(replica_env, command=command)
    assert code == 2, f"cdc {command} exited {code}, expected 2:\n{stderr}"
    line = error_line(stderr)  # exactly one `cdc: error:` line, and no traceback
    assert "wal_level" in line, line
    assert "'replica'" in line, line
    assert "'logical'" in line, line
    assert FIX in line, f"the fix `{FIX}` must be on the error line itself:\n{stderr}"
    assert "restart" in line, f"the error line must say that a restart is needed:\n{stderr}"
    assert elapsed < 30, f"cdc {command} took {elapsed:.1f} s to refuse"
    # A refusal touches nothing: no outbox table, no publication, no slot.
    assert server_objects(replica_cluster) == NOTHING


@pytest.mark.parametrize(
    ("service_role", "knob"),
    [
        ("rds_superuser", "rds.logical_replication = 1 in the DB parameter group"),
        ("cloudsqlsuperuser", "the database flag cloudsql.logical_decoding = on"),
        ("azure_pg_admin", "the server parameter wal_level = logical"),
    ],
)
def test_on_a_managed_service_the_fix_is_its_own_knob(replica_cluster, replica_env, service_role, knob):
    """ALTER SYSTEM is not the user's on RDS, Cloud SQL or Azure: the line names the service's setting. Each
    service is known by the role it creates (made here for the test, and dropped)."""
    with psycopg.connect(replica_cluster, autocommit=True, connect_timeout=10) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} NOLOGIN").format(psycopg.sql.Identifier(service_role)))
        try:
            code, stderr, _ = run_refused(replica_env, command="setup")
        finally:
            conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(service_role)))
    assert code == 2, stderr
    line = error_line(stderr)
    assert knob in line and "ALTER SYSTEM" not in line, line
