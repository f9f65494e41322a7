"""The least-privilege role of `cdc setup --role`: enough to stream, heartbeat and report status, and no more;
and a role without REPLICATION is refused plainly."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.integration.stream.test_pipeline import error_line, run_refused
from tests.plugins.pipeline import cdc, wait_until

pytestmark = pytest.mark.core


def as_role(dsn: str, role: str, password: str) -> str:
    params = conninfo_to_dict(dsn)
    params.update(user=role, password=password)
    return make_conninfo(**params)


@pytest.fixture
def role(outbox, pg_connect, unique_name):
    name = unique_name("cdc_role")[:63]
    yield name
    with pg_connect(dbname=conninfo_to_dict(outbox.dsn)["dbname"], autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_setup_role_streams_heartbeats_and_reports_with_only_its_grants(
    outbox, role, pipeline_process, consume
):
    done = cdc(outbox.env, "setup", "--role", role)
    assert done.returncode == 0, done.stderr
    assert f"07_role.sql: created role {role}" in done.stdout
    again = cdc(outbox.env, "setup", "--role", role)
    assert "07_role.sql: already present" in again.stdout

    attributes = outbox.conn.execute(
        "SELECT rolsuper, rolreplication, rolcanlogin, rolcreatedb, rolcreaterole"
        " FROM pg_roles WHERE rolname = %s",
        (role,),
    ).fetchone()
    assert attributes == (False, True, True, False, False)
    outbox.conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'role-pw-1'").format(sql.Identifier(role)))
    env = dict(
        outbox.env, CDC_DATABASE_URL=as_role(outbox.dsn, role, "role-pw-1"), CDC_HEARTBEAT_INTERVAL="0.5"
    )

    proc = pipeline_process(**{k: v for k, v in env.items() if k.startswith("CDC_")})
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("r-1"), outbox.event("r-2")])
    records = consume(outbox.topic("order"), 2, timeout=30)
    assert [r.headers["id"].decode() for r in records] == txn.ids
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the events confirmed by the role")
    status = wait_until(
        lambda: (
            (s := cdc(env, "status", "--json")).returncode == 0
            and json.loads(s.stdout)["last_heartbeat_seen"]
            and s
        ),
        30,
        "the role's heartbeats noted for cdc status",
    )
    assert json.loads(status.stdout)["outbox_rows"] == 2
    # ...and the position it saves for `cdc recover`.
    wait_until(
        lambda: json.loads(cdc(env, "status", "--json").stdout)["saved_commit_time"],
        30,
        "the role's saved position for cdc recover",
    )
    assert "heartbeat failed" not in proc.log()
    assert "could not note the heartbeat" not in proc.log()
    assert "could not save the acknowledged position" not in proc.log()
    assert proc.terminate() == 0

    # No more than that: the role cannot write the outbox or create anything.
    with psycopg.connect(as_role(outbox.dsn, role, "role-pw-1"), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(outbox.table)))


def test_a_role_without_replication_is_refused(outbox, role):
    outbox.conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'role-pw-2'").format(sql.Identifier(role)))
    env = dict(outbox.env, CDC_DATABASE_URL=as_role(outbox.dsn, role, "role-pw-2"), CDC_STARTUP_TIMEOUT="5")
    code, stderr, _ = run_refused(env)
    assert code == 2, stderr
    line = error_line(stderr)
    assert f"role '{role}' may not stream: it lacks the REPLICATION attribute" in line
    assert "role-pw-2" not in stderr


def test_a_role_name_that_would_break_the_setup_sql_is_refused_before_anything_runs(outbox, unique_name):
    # `$$` would end the DO body of 07_role.sql early; a quote or space is no name a DSN user can carry.
    role = unique_name("cdc_role")[:50] + "$$"
    fresh = dict(outbox.env, CDC_PUBLICATION=unique_name("pub")[:63])
    done = cdc(fresh, "setup", "--role", role)
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == (
        f"cdc: error: --role {role!r} is not a plain role name: use letters, digits and _ (starting with a"
        " letter or _, at most 63 characters), e.g. --role cdc_stream"
    )
    created = outbox.conn.execute(
        "SELECT (SELECT count(*) FROM pg_roles WHERE rolname LIKE %s),"
        " (SELECT count(*) FROM pg_publication WHERE pubname = %s)",
        (role.rstrip("$") + "%", fresh["CDC_PUBLICATION"]),
    ).fetchone()
    assert created == (0, 0), "nothing was applied, not even the scripts before 07_role.sql"


@pytest.fixture
def rds_replication(outbox):
    """Amazon RDS's role that lets its members stream (they cannot be given the REPLICATION attribute there).
    Cluster-wide, so dropped at once after the test."""
    outbox.conn.execute("CREATE ROLE rds_replication NOLOGIN")
    try:
        yield "rds_replication"
    finally:
        outbox.conn.execute("DROP ROLE rds_replication")


def test_on_amazon_rds_the_role_is_made_a_member_of_rds_replication(outbox, role, rds_replication):
    done = cdc(outbox.env, "setup", "--role", role)
    assert done.returncode == 0, done.stderr
    row = outbox.conn.execute(
        "SELECT rolreplication, pg_has_role(rolname, 'rds_replication', 'MEMBER') FROM pg_roles"
        " WHERE rolname = %s",
        (role,),
    ).fetchone()
    assert row == (False, True), "RDS: membership, not the attribute"
    # The start's check counts the membership (real RDS then lets it stream; stock PostgreSQL does not, so
    # only the check is seen here).
    outbox.conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'role-pw-3'").format(sql.Identifier(role)))
    env = dict(outbox.env, CDC_DATABASE_URL=as_role(outbox.dsn, role, "role-pw-3"), CDC_STARTUP_TIMEOUT="3")
    _, stderr, _ = run_refused(env)
    assert "may not stream" not in stderr, stderr[-2000:]


def test_on_amazon_rds_a_role_outside_rds_replication_is_told_to_join_it(outbox, role, rds_replication):
    outbox.conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'role-pw-4'").format(sql.Identifier(role)))
    env = dict(outbox.env, CDC_DATABASE_URL=as_role(outbox.dsn, role, "role-pw-4"), CDC_STARTUP_TIMEOUT="5")
    code, stderr, _ = run_refused(env)
    assert code == 2, stderr
    line = error_line(stderr)
    assert "it is not a member of rds_replication. Fix: GRANT rds_replication TO" in line and role in line
