"""The way from Debezium works as docs/operations.md ("Moving from Debezium") writes it (issue 43, item 8):
each block of its steps, read from the document and run as written on the stack (the table's name and the
time aside), against a table with Debezium's layout that the connector had been reading.

The timeline is the one step 5 is for: the connector published the rows before its stop (here: records with
its `id` header, as it writes them), rows were committed after its stop and before our slot was made, and
rows after. `cdc run` publishes those after, `cdc outbox republish --since` those in between, and `cdc
audit` then finds every row in Kafka; `cdc outbox prune` runs on the preset too."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.integration.stream.test_exactly_once import read_all
from tests.plugins.kafka import client_config, delete_topics, with_stack_security
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"


def recipe() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of "Moving from Debezium", in order; then the inline `cdc ...`
    commands of its last step, as ("sh", command)."""
    section = DOC.read_text().split("## Moving from Debezium", 1)[1].split("\n## ", 1)[0]
    blocks = [
        (lang, textwrap_dedent(body)) for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    ]
    last = section.rsplit("\n6. ", 1)[1] if "\n6. " in section else ""
    blocks += [("sh", command) for command in re.findall(r"`(cdc (?:audit|outbox prune)[^`]*)`", last)]
    return blocks


def textwrap_dedent(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines())


@pytest.fixture
def names(pg_database: str, kafka_bootstrap: str, kafka_admin, unique_name, tmp_path: Path):
    table = unique_name("dbz")[:40]
    env = {
        "CDC_DATABASE_URL": pg_database,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "CDC_SLOT": unique_name("slot")[:63],
        "CDC_PUBLICATION": unique_name("pub")[:63],
        "CDC_TABLE": f"public.{table}",
        "CDC_TOPIC_TEMPLATE": unique_name("dbz") + ".{aggregate_type}",
        "CDC_DLQ_TOPIC": unique_name("dlq"),
        "CDC_SCHEMAS_DIR": str(tmp_path / "schemas"),
        "CDC_STATUS_INTERVAL": "1",
        "CDC_CONFIG": str(tmp_path / "cdc.toml"),
        "PYTHONUNBUFFERED": "1",
    }
    shutil.copytree(SCHEMAS_DIR, tmp_path / "schemas")
    yield table, env
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND NOT active",
            (env["CDC_SLOT"],),
        )
    delete_topics(
        kafka_admin, [env["CDC_TOPIC_TEMPLATE"].format(aggregate_type="order"), env["CDC_DLQ_TOPIC"]]
    )


def test_the_documented_migration_from_debezium_runs_step_by_step(names, tmp_path: Path):
    table, env = names
    env = with_stack_security({**{k: v for k, v in os.environ.items() if not k.startswith("CDC_")}, **env})
    steps = recipe()
    assert [lang for lang, _ in steps] == ["sql", "toml", "sh", "sh", "sh", "sh", "sh"], steps
    conn = psycopg.connect(env["CDC_DATABASE_URL"], autocommit=True)
    ident = sql.Identifier("public", table)

    def insert(n: int) -> list[str]:
        ids = [str(uuid.uuid4()) for _ in range(n)]
        with conn.transaction():
            for i, event_id in enumerate(ids):
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload)"
                        " VALUES (%s, 'order', %s, 'OrderPlaced', %s)"
                    ).format(ident),
                    (event_id, f"o-{i % 3}", Jsonb(order_placed(f"o-{event_id[:8]}"))),
                )
        return ids

    # Debezium's outbox table (its documentation's layout), read by the connector for a while.
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,"
            " aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
        ).format(ident)
    )
    published_by_debezium = insert(3)

    def run(command: str, **extra: str) -> subprocess.CompletedProcess[str]:
        argv = shlex.split(command)
        assert argv[0] == "cdc", command
        return subprocess.run(
            [sys.executable, "-m", "cdc", *argv[1:]],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )

    # 1. The creation time, while the connector still runs: statement by statement (CONCURRENTLY).
    lang, text = steps[0]
    text = text.replace("public.outbox", f"public.{table}").replace(
        "outbox_created_at_idx", f"{table}_created_at_idx"
    )
    for statement in filter(None, (s.strip() for s in text.split(";"))):
        conn.execute(statement)
    published_by_debezium += insert(3)
    # 2. The mapping.
    Path(env["CDC_CONFIG"]).write_text(steps[1][1] + "\n")
    # The connector stops; its last offset's time, and rows committed before our slot exists.
    time.sleep(0.01)
    stopped_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    time.sleep(0.01)
    in_between = insert(4)
    # 3. cdc setup, cdc check.
    for command in steps[2][1].splitlines():
        done = run(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    after = insert(5)
    # 4. cdc run.
    (command,) = steps[3][1].splitlines()
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 - closed below
    argv = shlex.split(command)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc", *argv[1:]], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        topic = env["CDC_TOPIC_TEMPLATE"].format(aggregate_type="order")
        wait_until(lambda: set(after) <= arrived(env, topic), 60, "cdc run to publish the rows after setup")
        _publish_as_debezium(env, published_by_debezium)  # into the topic cdc run made (no auto-creation)
        assert not set(in_between) & arrived(env, topic), "no slot held these"
        # 5. Republish what fell between the connector's stop and our slot.
        (command,) = steps[4][1].splitlines()
        since = stopped_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        command = re.sub(r"--since \S+", f"--since {since}", command)
        done = run(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        seen = arrived(env, topic)
        assert set(in_between) <= seen, "republish --since did not publish the rows in between"
        assert not (set(published_by_debezium) & _ours(env, topic)), "republished rows from before the stop"
        # 6. audit and prune, as the last step writes them.
        wait_until(lambda: _saved_past(conn, env, after), 60, "the saved position past the rows")
        time.sleep(1)
        for _, command in steps[5:]:
            done = run(command)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
        conn.close()
    assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]


def arrived(env: dict[str, str], topic: str) -> set[str]:
    return {
        dict(r.headers())["id"].decode()
        for r in read_all(env["CDC_KAFKA_BOOTSTRAP_SERVERS"], topic, quiet=1.0)
    }


def _ours(env: dict[str, str], topic: str) -> set[str]:
    """The ids of the records `cdc run` or `cdc outbox republish` wrote (not the connector's)."""
    records = read_all(env["CDC_KAFKA_BOOTSTRAP_SERVERS"], topic, quiet=1.0)
    return {dict(r.headers())["id"].decode() for r in records if "commit_lsn" in dict(r.headers())}


def _publish_as_debezium(env: dict[str, str], ids: list[str]) -> None:
    """What the connector wrote before its stop: its JSON value, key and `id` header, to the same topic."""
    topic = env["CDC_TOPIC_TEMPLATE"].format(aggregate_type="order")
    producer = Producer(client_config(env["CDC_KAFKA_BOOTSTRAP_SERVERS"]))
    failed: list[object] = []
    for event_id in ids:
        producer.produce(
            topic,
            key=b"o-0",
            value=json.dumps({"id": event_id}).encode(),
            headers=[("id", event_id)],
            on_delivery=lambda err, _msg: err is not None and failed.append(err),
        )
    assert producer.flush(30) == 0 and not failed, failed


def _saved_past(conn: psycopg.Connection, env: dict[str, str], ids: list[str]) -> bool:
    row = conn.execute(
        "SELECT commit_time >= (SELECT max(created_at) FROM "
        + env["CDC_TABLE"]
        + ") FROM public.cdc_checkpoint"
        " WHERE slot = %s",
        (env["CDC_SLOT"],),
    ).fetchone()
    return bool(row and row[0])


def test_the_preset_without_created_at_says_how_to_add_it(pg_database: str):
    """Before the steps: each command that needs the column refuses with them (exit 2)."""
    from click.testing import CliRunner

    from cdc.cli import main

    env = {
        "CDC_DATABASE_URL": pg_database,
        "CDC_COLUMNS": "debezium",
        "CDC_TABLE": "app.outbox",
    }
    for args in (
        ["outbox", "prune", "--older-than", "7d"],
        ["outbox", "republish", "--since", "1h"],
        ["audit", "--since", "1h"],
    ):
        done = CliRunner().invoke(main, args, env=env)
        assert done.exit_code == 2, (args, done.output)
        assert (
            "ALTER TABLE app.outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()" in done.output
        )
        assert 'columns = { preset = "debezium", created_at = "created_at" }' in done.output, done.output
