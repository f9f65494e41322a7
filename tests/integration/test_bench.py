"""`make bench` in small: 2,000 events drained by the bare reader, `cdc run` at-least-once and exactly-once,
each in its own topic with every event id counted, a short latency phase of each, and nothing left behind.
About 30 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.plugins.pipeline import ROOT

EVENTS = 2000


@pytest.mark.slow
@pytest.mark.plain("the benchmark's relays and readers connect without TLS or SASL settings")
def test_bench_measures_every_relay_on_its_own_slot_and_cleans_up(
    pg_admin_dsn, kafka_bootstrap, kafka_admin, pg_connect, unique_name, tmp_path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=pg_admin_dsn, CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)
    database, output = unique_name("bench"), tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.bench.run", "--events", str(EVENTS), "--database", database]
    command += ["--latency-seconds", "2", "--latency-rate", "2000", "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]

    result = json.loads(output.read_text())
    runs = {run["relay"]: run for run in result["throughput"]["runs"]}
    assert set(runs) == {"bare", "cdc", "cdc-eo"}
    assert runs["bare"]["events"] == EVENTS
    assert runs["bare"]["transport"] == result["config"]["transport"] == "tcp"
    for relay in ("cdc", "cdc-eo"):
        assert runs[relay]["records"] == runs[relay]["distinct_event_ids"] == EVENTS, relay
        assert runs[relay]["peak_rss_mb"] > 0
    # Kafka transactions: each commit adds a marker to every partition it wrote.
    assert runs["cdc-eo"]["offsets"] > EVENTS
    assert all(run["events_per_s"] > 0 for run in runs.values())
    assert result["throughput"]["ratio"] > 0
    assert result["latency"]["received_all"] and result["latency_exactly_once"]["received_all"]
    kafka = result["kafka_check"]
    assert kafka["records"] == kafka["expected"] and kafka["dlq_records"] == 0
    assert "| `cdc run`, exactly-once |" in done.stdout
    tracing = result["tracing"]["runs"]
    assert set(tracing) == {"off", "1%", "100%"}
    assert all(run["records"] == run["distinct_event_ids"] == EVENTS for run in tracing.values()), tracing
    # A drain of 2,000 events can be shorter than one poll of the reader, and its CPU figure is then
    # none rather than a wrong one: the ratio is there, a number or None.
    assert all("cpu_of_off" in run for run in tracing.values()) and "TRACING" in done.stdout

    # Nothing left behind: the database and its slots, the topics.
    assert "cleanup_problems" not in result
    with pg_connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
            (f"bench_{result['run_id']}%",),
        )
        assert slots.fetchall() == []
    topics = kafka_admin.list_topics(timeout=10).topics
    assert [t for t in topics if t.startswith(f"bench.{result['run_id']}.")] == []
