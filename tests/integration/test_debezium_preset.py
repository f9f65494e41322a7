"""The Debezium preset, record for record against real Debezium (issue 26 item 3).

The same outbox rows, in a table with Debezium's own column names (`cdc setup` with ``columns = "debezium"``),
go through two relays that each read a slot of their own made before the rows: `cdc run` with the preset,
and Debezium 3.6.1's PostgreSQL connector with its Outbox Event Router in Kafka Connect standalone (the jars
of `make bench-debezium`), left at its defaults but for where it reads and writes, and one additional field
placed as a header. Both write to topics of their own with the same partition count. Then each event is
compared by id: the topic's aggregate part, the key's bytes, the partition, every header Debezium writes
(name and bytes) and the value (Debezium's JSON text against our Avro, decoded).

What differs by design is asserted as such, so that a change on either side shows: docs/operations.md,
"Moving from Debezium", lists each difference and why."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import NewTopic
from psycopg import sql

from cdc.config_loader import load_settings
from cdc.consumer import EventDeserializer
from cdc.ops import setup as cdc_setup
from tests.bench.debezium import config as dbz
from tests.bench.debezium.connect import ConnectProcess
from tests.bench.debezium.jars import ensure_jars
from tests.integration.stream.test_exactly_once import read_all
from tests.kafka_admin import create_topics
from tests.plugins.kafka import read_topics
from tests.plugins.pipeline import ROOT, SCHEMAS_DIR, PipelineProcess, free_port, order_placed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.debezium,
    pytest.mark.plain("Debezium's Kafka Connect worker is run without TLS or SASL settings"),
]

PARTITIONS = 6
DEBEZIUM_CONTEXT = ("connectorLogicalName", "connectorName", "runId", "taskId")
KEYS = ["order-1", "Bestellung-ü-7", "注文-42", "🛒-3", "Tenant/1:Order#3", "x" * 120]


def rows() -> list[dict[str, Any]]:
    """Two aggregate types, two event types, nested payloads, keys of every kind, a tenant per row."""
    out = []
    for i in range(48):
        key = KEYS[i % len(KEYS)] + ("" if i < len(KEYS) else f"-{i}")
        payload = order_placed(f"o-{i}", amount_cents=1000 + i)
        payload["items"] = [{"sku": f"SKU-{j}-ü", "quantity": j + 1} for j in range(i % 3 + 1)]
        out.append(
            {
                "id": str(uuid.uuid4()),
                "aggregatetype": "order" if i % 4 else "customer",
                "aggregateid": key,
                "type": "OrderPlaced",
                "payload": payload,
                "tenant": f"tenant-{i % 3}",
            }
        )
    return out


def debezium_connector(database: dbz.Database, slot: str, publication: str, table: str, prefix: str) -> dict:
    """Debezium's defaults for the Outbox Event Router (its column names, route.by.field = aggregatetype,
    StringConverter for keys and values as the Connect worker below sets), and what a user must set."""
    config = dbz.source_config(
        name="debezium-preset-compare",
        database=database,
        slot=slot,
        publication=publication,
        table=table,
        topic_prefix=prefix,
    )
    config["transforms.outbox.table.fields.additional.placement"] = "tenant:header:tenant"
    return config


@pytest.fixture
def debezium_libs() -> Path:
    return ensure_jars(ROOT / ".stack", ROOT / ".stack" / "logs" / "maven-debezium.log")


def test_the_debezium_preset_writes_what_debezium_writes_record_for_record(
    outbox, kafka_bootstrap, kafka_admin, debezium_libs, tmp_path
):
    tag = uuid.uuid4().hex[:10]
    table, publication = f"dbz_outbox_{tag}", f"dbz_pub_{tag}"
    ours_slot, their_slot = f"dbz_cdc_{tag}", f"dbz_debezium_{tag}"
    ours_prefix, their_prefix = f"dbzcmp.{tag}.cdc", f"dbzcmp.{tag}.debezium"
    env = {
        **outbox.env,
        "CDC_COLUMNS": "debezium",
        "CDC_TABLE": f"public.{table}",
        "CDC_SLOT": ours_slot,
        "CDC_PUBLICATION": publication,
        "CDC_TOPIC_TEMPLATE": ours_prefix + ".{aggregate_type}",
        "CDC_DLQ_TOPIC": f"{ours_prefix}.dlq",
        "CDC_SCHEMAS_DIR": str(SCHEMAS_DIR),
        "CDC_VALUE_FORMAT": "single-object",
    }
    settings = load_settings(config_file=None, environ=env, overrides={})
    cdc_setup.apply(settings)
    topics = [f"{p}.{t}" for p in (ours_prefix, their_prefix) for t in ("order", "customer")]
    topics.append(f"{ours_prefix}.dlq")
    outbox.topics.extend(topics)  # deleted after the test
    create_topics(kafka_admin, [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in topics])
    connect = None
    try:
        with psycopg.connect(outbox.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN tenant text").format(sql.Identifier(table)))
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (their_slot,))
            written = rows()
            with conn.transaction():
                for row in written:
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, tenant)"
                            " VALUES (%s, %s, %s, %s, %s::jsonb, %s)"
                        ).format(sql.Identifier(table)),
                        (
                            row["id"],
                            row["aggregatetype"],
                            row["aggregateid"],
                            row["type"],
                            json.dumps(row["payload"]),
                            row["tenant"],
                        ),
                    )
        # cdc run, to the end of what was written.
        ours = PipelineProcess(env, tmp_path / "cdc.log")
        try:
            ours.wait_streaming()
            published = read_topics(kafka_bootstrap, topics[:2], len(written), 60)
            assert len(published) == len(written), f"cdc run published {len(published)}:\n{ours.tail()}"
            assert ours.terminate(timeout=40) == 0, ours.tail()
        finally:
            ours.cleanup()
        # Debezium, the same.
        database = dbz.database_from_dsn(outbox.dsn)
        work = tmp_path / "connect"
        work.mkdir(mode=0o700)
        port = free_port()
        worker = {
            "bootstrap.servers": kafka_bootstrap,
            "key.converter": dbz.STRING_CONVERTER,
            "value.converter": dbz.STRING_CONVERTER,
            "offset.storage.file.filename": str(work / "offsets"),
            "listeners": f"http://127.0.0.1:{port}",
        }
        connector = debezium_connector(database, their_slot, publication, f"public.{table}", their_prefix)
        for name, config in (("worker", worker), ("connector", connector)):
            (work / f"{name}.properties").write_text(dbz.render_properties(config))
        connect = ConnectProcess(
            libs=debezium_libs,
            worker_file=work / "worker.properties",
            connector_file=work / "connector.properties",
            log_path=tmp_path / "connect.log",
            rest_port=port,
            name=connector["name"],
        )
        published = read_topics(kafka_bootstrap, topics[2:4], len(written), 180, check=connect.check)
        assert len(published) == len(written), f"Debezium published {len(published)}:\n{connect.log_tail()}"
        connect.stop()

        compare(written, kafka_bootstrap, ours_prefix, their_prefix)
    finally:
        if connect is not None:
            connect.stop()
        with psycopg.connect(outbox.dsn, autocommit=True) as conn:
            for slot in (ours_slot, their_slot):
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (slot,),
                )
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))


def by_id(bootstrap: str, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for aggregate_type in ("order", "customer"):
        for msg in read_all(bootstrap, f"{prefix}.{aggregate_type}"):
            headers = defaultdict(list)
            for name, value in msg.headers() or []:
                headers[name].append(value)
            event_id = headers["id"][0].decode()
            assert event_id not in out, f"{event_id} twice"
            out[event_id] = (aggregate_type, msg)
    return out


def compare(written: list[dict[str, Any]], bootstrap: str, ours_prefix: str, their_prefix: str) -> None:
    ours, theirs = by_id(bootstrap, ours_prefix), by_id(bootstrap, their_prefix)
    assert set(ours) == set(theirs) == {r["id"] for r in written}
    deserializer = EventDeserializer(SCHEMAS_DIR)
    for row in written:
        (our_type, our), (their_type, their) = ours[row["id"]], theirs[row["id"]]
        assert our_type == their_type == row["aggregatetype"], "topic"
        assert our.key() == their.key() == row["aggregateid"].encode(), "key bytes"
        assert our.partition() == their.partition(), f"partition of key {row['aggregateid']!r}"
        their_headers = dict(their.headers())
        our_headers = dict(our.headers())
        # Debezium writes the event id, the additional field and its own context (connector name, task, run
        # id); we write the id too, beside our own headers (event_type, schema_version, aggregate_type,
        # commit_lsn, xid), and have no additional fields as headers (documented differences).
        context = {h for h in their_headers if h.startswith("__debezium.context.")}
        assert context == {f"__debezium.context.{n}" for n in DEBEZIUM_CONTEXT}, their_headers
        assert set(their_headers) - context == {"id", "tenant"}, their_headers
        assert our_headers["id"] == their_headers["id"] == row["id"].encode(), "id header"
        assert "tenant" not in our_headers
        # The value: Debezium's is the payload's JSON text (StringConverter), ours the same payload in Avro.
        event = deserializer(our)
        assert json.loads(their.value()) == row["payload"]
        assert event.payload == row["payload"], row["id"]
        # Debezium stamps a record with the time its connector processed the change (the envelope's ts_ms),
        # we with the transaction's commit time (what Debezium calls source.ts_ms): ours comes first.
        assert our.timestamp()[1] <= their.timestamp()[1], "timestamp"
