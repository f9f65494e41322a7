"""Failover slots through a real promotion (PostgreSQL 17+): `cdc setup --failover` on the primary, the slot
synchronized to a physical standby, `cdc run` with a multi-host database_url under load; the primary stops,
the standby is promoted, and the pipeline goes on from the synchronized slot with nothing lost."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from cdc.avro.store import SchemaStore
from tests.integration.stream.test_pipeline import decode_value
from tests.plugins.kafka import delete_topics
from tests.plugins.pgcluster import FailoverPair
from tests.plugins.pipeline import (
    SCHEMAS_DIR,
    PipelineProcess,
    cdc,
    order_placed,
    own_cluster_env,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.core, pytest.mark.pg(min=17)]

AGGREGATES = 8
INSERT = sql.SQL(
    "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
    " VALUES (%s, 'order', %s, 'OrderPlaced', 1, %s::jsonb)"
)


class Writer(threading.Thread):
    """Commits small outbox transactions through the multi-host DSN until stopped; event i of aggregate
    'agg-<i % 8>' carries amount_cents = i. Only commits that returned are counted as written; a commit cut
    by the failover may or may not have happened, and is left out of both sides."""

    def __init__(self, dsn: str, table: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.table = sql.Identifier(table)
        self.committed: dict[str, int] = {}
        self.uncertain: set[str] = set()
        self.paused = threading.Event()
        self.stopped = threading.Event()
        self.errors = 0
        self._next = 0

    def run(self) -> None:
        conn = None
        while not self.stopped.is_set():
            if self.paused.is_set():
                time.sleep(0.05)
                continue
            batch = []
            for _ in range(5):
                batch.append((str(uuid.uuid4()), self._next))
                self._next += 1
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, connect_timeout=3)
                with conn.transaction():
                    for event_id, i in batch:
                        conn.execute(
                            INSERT.format(self.table),
                            (event_id, f"agg-{i % AGGREGATES}", json.dumps(order_placed(f"o-{i}", i))),
                        )
                self.committed.update(batch)
            except psycopg.Error:
                self.errors += 1
                self.uncertain.update(event_id for event_id, _ in batch)
                if conn is not None:
                    conn.close()
                time.sleep(0.2)
                continue
            time.sleep(0.02)
        if conn is not None:
            conn.close()


def read_all(bootstrap: str, topic: str, expected: set[str], timeout: float) -> list:
    from tests.plugins.kafka import read_topic

    deadline = time.monotonic() + timeout
    records: list = []
    while time.monotonic() < deadline:
        records = read_topic(bootstrap, topic, 10 * len(expected), timeout=3)
        if expected <= {r.headers["id"].decode() for r in records}:
            break
    return records


def test_the_pipeline_follows_a_promotion_on_its_synchronized_slot_and_nothing_is_lost(
    failover_pair: FailoverPair, kafka_bootstrap, kafka_admin, unique_name, tmp_path: Path
):
    pair = failover_pair
    prefix = unique_name("cdc")
    topic = f"{prefix}.order"
    dlq = unique_name("dlq")
    env = own_cluster_env(
        pair.dsn(pair.primary),
        kafka_bootstrap,
        unique_name,
        CDC_TOPIC_TEMPLATE=prefix + ".{aggregate_type}",
        CDC_DLQ_TOPIC=dlq,
        CDC_TOPIC_PARTITIONS="3",
        CDC_STATUS_INTERVAL="1",
        CDC_BACKOFF_MAX="1",
        CDC_LOG_LEVEL="INFO",
    )
    done = cdc(env, "setup", "--failover")
    assert done.returncode == 0, done.stderr
    env["CDC_DATABASE_URL"] = pair.multi_host_dsn
    proc = PipelineProcess(env, tmp_path / "pipeline.log")
    writer = Writer(pair.multi_host_dsn, env["CDC_TABLE"].removeprefix("public."))
    try:
        proc.wait_streaming()
        assert "failover:" not in proc.log(), proc.tail()  # set up as it should be: no warning
        writer.start()

        def synced() -> bool:
            status = cdc(env, "status", "--json")
            report = json.loads(status.stdout)
            return report["synced_on_standby"] is True and report["failover_problems"] == []

        wait_until(synced, 90, "cdc status to show the slot synchronized to the standby", interval=1)
        time.sleep(2)

        writer.paused.set()  # the application fails over too: nothing is written to a stopping primary
        time.sleep(0.3)
        pair.stop_primary()
        pair.promote_standby()
        writer.paused.clear()
        proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", timeout=60)
        time.sleep(3)
        writer.stopped.set()
        writer.join(10)

        expected = set(writer.committed)
        records = read_all(kafka_bootstrap, topic, expected, timeout=90)
        seen = [r.headers["id"].decode() for r in records]
        missing = expected - set(seen)
        assert not missing, f"{len(missing)} of {len(expected)} events lost across the promotion"
        duplicates = len(seen) - len(set(seen))

        # Per aggregate, the first copy of each event arrives in the order it was written.
        store = SchemaStore(SCHEMAS_DIR)
        firsts: dict[str, list[int]] = defaultdict(list)
        known: set[str] = set()
        for record in records:
            event_id = record.headers["id"].decode()
            if event_id in known or event_id not in expected:
                continue
            known.add(event_id)
            _, _, payload = decode_value(store, record.value)
            firsts[record.key.decode()].append(payload["amount_cents"])
        assert all(seq == sorted(seq) for seq in firsts.values()), "per-aggregate order broken"
        assert proc.alive(), proc.tail()
        assert proc.terminate() == 0
        print(
            f"promotion: {len(expected)} events, {duplicates} duplicates, {writer.errors} failed commits "
            f"({len(writer.uncertain)} uncertain events)"
        )
    finally:
        writer.stopped.set()
        proc.cleanup()
        delete_topics(kafka_admin, [topic, dlq])


def test_run_warns_when_a_failover_slot_has_no_standby_to_sync_it(
    tight_cluster, kafka_bootstrap, unique_name, tmp_path: Path
):
    env = own_cluster_env(tight_cluster, kafka_bootstrap, unique_name)
    done = cdc(env, "setup", "--failover")
    assert done.returncode == 0, done.stderr
    try:
        status = json.loads(cdc(env, "status", "--json").stdout)
        assert status["failover"] is True and status["synced_on_standby"] is None
        assert any("synchronized_standby_slots is empty" in p for p in status["failover_problems"])
        proc = PipelineProcess(env, tmp_path / "pipeline.log")
        try:
            proc.wait_streaming()
            log = proc.log()
            assert proc.terminate() == 0
        finally:
            proc.cleanup()
    finally:
        with psycopg.connect(tight_cluster, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE active_pid IS NOT NULL"
            )
            time.sleep(0.5)
            conn.execute("SELECT pg_drop_replication_slot(%s)", (env["CDC_SLOT"],))
    assert "failover: synchronized_standby_slots is empty on the primary" in log
