"""`make bench-debezium` in small: 2,000 events through the bare reader, `cdc run` and Debezium with Avro
values (one JVM), every event id counted, one Avro record decoded through the registry, and nothing left
behind. About 30 s, most of it the JVM's start; the first run on a machine also resolves the jars (~35 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.pipeline import ROOT
from tests.plugins.registry import registry_get

EVENTS = 2000


@pytest.mark.slow
@pytest.mark.plain("the benchmark runs Debezium and its own clients without TLS or SASL settings")
def test_bench_debezium_counts_decodes_and_cleans_up(
    pg_admin_dsn, kafka_bootstrap, schema_registry_url, kafka_admin, pg_connect, unique_name, tmp_path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_DATABASE_URL=pg_admin_dsn,
        CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        CDC_SCHEMA_REGISTRY_URL=schema_registry_url,
    )
    database, output = unique_name("bench_dbz"), tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.bench.debezium", "--events", str(EVENTS)]
    command += ["--relays", "bare,cdc,debezium-avro", "--database", database, "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]

    result = json.loads(output.read_text())
    runs = {run["relay"]: run for run in result["runs"]}
    assert runs["bare"]["events"] == EVENTS
    assert runs["cdc"]["records"] == runs["debezium-avro"]["records"] == EVENTS
    assert runs["cdc"]["distinct_event_ids"] == runs["debezium-avro"]["distinct_event_ids"] == EVENTS
    assert all(run["events_per_s"] > 0 for run in runs.values())
    avro = runs["debezium-avro"]["sample_record"]
    assert avro["value_format"] == "avro confluent"
    assert avro["decoded_fields"] == ["amount_cents", "currency", "customer_id", "items", "order_id"]
    assert avro["key"].startswith("order-")
    assert {"id", "event_type"} <= set(avro["headers"])
    assert runs["cdc"]["sample_record"]["value_format"] == "avro single-object"
    assert runs["debezium-avro"]["connector_config"]["database.password"] == "***"
    assert "| `cdc run` |" in done.stdout

    # Nothing left behind: the JVM, the database and its slots, the topics, the registry's artifact.
    assert "cleanup_problems" not in result
    assert not Path(f"/proc/{runs['debezium-avro']['pid']}").exists()
    prefix = f"bench_{result['run_id']}"
    with pg_connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s", (prefix + "%",)
        )
        assert slots.fetchall() == []
    topics = kafka_admin.list_topics(timeout=10).topics
    assert [t for t in topics if t.startswith(f"bench.{result['run_id']}.")] == []
    assert [s for s in registry_get(f"{schema_registry_url}/subjects") if result["run_id"] in s] == []
