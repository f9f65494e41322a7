"""A rotated database password is picked up without a restart (issue 27 item 5): `cdc run` reads it from
database_password_file at every (re)connect, so a secret that Kubernetes updates in place, or a token that
expires, takes effect at the next connection."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.plugins.pipeline import Outbox, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_rotated_password_file_is_read_at_the_next_connection(outbox: Outbox, pipeline_process, tmp_path):
    role = f"rot_{uuid.uuid4().hex[:10]}"
    first, second = f"first-{uuid.uuid4()}", f"second-{uuid.uuid4()}"
    outbox.conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(role), sql.Literal(first))
    )
    secret = tmp_path / "db-password"
    secret.write_text(first + "\n")
    params = conninfo_to_dict(outbox.dsn)
    params.pop("password", None)
    params["user"] = role
    proc = None
    try:
        proc = pipeline_process(
            CDC_DATABASE_URL=make_conninfo("", **params), CDC_DATABASE_PASSWORD_FILE=str(secret)
        )
        proc.wait_streaming()
        txn = outbox.commit([outbox.event("r-1")])
        wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the first event confirmed")

        # Rotate: the server takes the new password, the file says it, the old one no longer works.
        outbox.conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(second))
        )
        secret.write_text(second + "\n")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(make_conninfo("", **params, password=first), connect_timeout=5).close()
        # Every connection of the pipeline ends, as at a failover: it must connect again, with the new one.
        outbox.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", 30)
        txn = outbox.commit([outbox.event("r-2")])
        wait_until(
            lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "an event after the rotation confirmed"
        )
        assert first not in proc.log() and second not in proc.log(), "a password in the log"
        assert proc.terminate(timeout=40) == 0, proc.tail()
    finally:
        if proc is not None:
            proc.cleanup()
        outbox.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        outbox.conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
