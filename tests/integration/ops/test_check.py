"""`cdc check` against the stack (issue 43, item 4): every problem at once, nothing changed, exit 0 only when
`cdc run` would start, else the exit code it would stop with (2: fix a setting, a right or an object; 1: an
outage)."""

from __future__ import annotations

import json
import secrets
import uuid

import psycopg
import pytest
from psycopg import sql

from tests.plugins.pipeline import Outbox, cdc, free_port, wait_until
from tests.plugins.postgres import dsn_for

pytestmark = pytest.mark.integration


def check(env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    done = cdc(env, "check", "--json", *args, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stdout


def texts(body: dict, level: str) -> list[str]:
    return [f["text"] for f in body["findings"] if f["level"] == level]


def topic_exists(admin, topic: str) -> bool:
    metadata = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    return metadata is not None and metadata.error is None


def test_a_ready_outbox_checks_clean_changes_nothing_and_cdc_run_then_starts(
    outbox: Outbox, kafka_admin, pipeline_process
):
    env = {**outbox.env, "CDC_AGGREGATE_TYPES": "order"}
    confirmed = outbox.confirmed_lsn()
    code, body, out = check(env)
    assert code == 0 and body["would_start"], out
    assert not texts(body, "fail"), out
    said = " | ".join(texts(body, "ok"))
    for expected in (
        "wal_level = logical",
        "may stream",
        f"slot {outbox.slot}",
        f"publication {outbox.settings.publication} publishes the inserts",
        "has the columns",
        "a replication connection is accepted",
        "broker(s) answer",
        f"topic {outbox.dlq_topic} does not exist yet",
        f"topic {outbox.topic('order')} does not exist yet",
    ):
        assert expected in said, (expected, out)
    # Nothing changed: no topic created, the slot neither moved nor held.
    assert not topic_exists(kafka_admin, outbox.dlq_topic)
    assert not topic_exists(kafka_admin, outbox.topic("order"))
    assert outbox.confirmed_lsn() == confirmed and outbox.slot_active_pid() is None
    proc = pipeline_process(CDC_AGGREGATE_TYPES="order")
    proc.wait_streaming()
    # While it streams, a check before a deploy warns of the holder and still says it would start.
    code, body, out = check(env)
    assert code == 0, out
    assert any("is in use by another process" in t for t in texts(body, "warn")), out
    assert proc.terminate() == 0


def test_every_problem_is_reported_at_once_with_exit_2(outbox: Outbox, tmp_path):
    empty = tmp_path / "schemas"
    empty.mkdir()
    env = {
        **outbox.env,
        "CDC_SLOT": "no_such_slot_" + uuid.uuid4().hex[:8],
        "CDC_PUBLICATION": "no_such_pub_" + uuid.uuid4().hex[:8],
        "CDC_SCHEMAS_DIR": str(empty),
        "CDC_COLUMNS": "debezium",  # the outbox's columns are the default layout's
        "CDC_TOPIC_REPLICATION_FACTOR": "3",  # one broker
    }
    code, body, out = check(env)
    assert code == 2 and not body["would_start"], out
    failures = " | ".join(texts(body, "fail"))
    for expected in (
        f"replication slot '{env['CDC_SLOT']}' does not exist",
        f"publication '{env['CDC_PUBLICATION']}' does not exist",
        "has no column 'aggregatetype'",
        "replication factor 3",
    ):
        assert expected in failures, (expected, out)
    assert any("holds no schema: every event would be dead-lettered" in t for t in texts(body, "warn")), out
    text = cdc(env, "check").stdout
    assert text.rstrip().endswith("`cdc run` would not start"), text
    assert sum(line.startswith("FAIL ") for line in text.splitlines()) == len(texts(body, "fail")) >= 4, text


def test_kafka_unreachable_is_an_outage_exit_1_and_postgresql_is_still_checked(outbox: Outbox):
    env = {
        **outbox.env,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "CDC_STARTUP_TIMEOUT": "2",
    }
    code, body, out = check(env)
    assert code == 1, out
    assert any("did not answer within 2 s" in t for t in texts(body, "fail")), out
    assert any("wal_level = logical" in t for t in texts(body, "ok")), out


def test_a_role_without_its_rights_is_named_with_the_grants(outbox: Outbox):
    role = "chk_" + uuid.uuid4().hex[:10]
    password = secrets.token_urlsafe(16)
    conn = outbox.conn
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
    )
    try:
        env = {**outbox.env, "CDC_DATABASE_URL": dsn_for(outbox.dsn, user=role, password=password)}
        code, body, out = check(env)
        assert code == 2, out
        failures = " | ".join(texts(body, "fail"))
        assert f"role '{role}' may not stream" in failures and "REPLICATION" in failures, out
        assert 'lacks SELECT, INSERT, UPDATE on "public"."cdc_checkpoint"' in failures, out
        assert "GRANT SELECT, INSERT, UPDATE ON" in failures, out
        assert any("heartbeats fail" in t for t in texts(body, "warn")), out
        assert password not in out
    finally:
        wait_until(lambda: _drop_role(conn, role), 10, "the role dropped")


def _drop_role(conn: psycopg.Connection, role: str) -> bool:
    try:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    except psycopg.errors.DependentObjectsStillExist:
        return False
    return True
