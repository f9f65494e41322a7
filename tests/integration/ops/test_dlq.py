"""`cdc dlq list|show|replay` against the real stack: an event dead-lettered for a missing schema is replayed
once the schema exists, exactly once, with its original key and headers; one that can never fit stays."""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, TopicPartition
from fastavro import schemaless_reader
from fastavro.schema import parse_schema

from cdc.avro.encoder import MAGIC
from cdc.avro.store import SchemaStore
from cdc.ops.discard import who
from tests.plugins.kafka import client_config, java_partition, read_topic
from tests.plugins.pipeline import SCHEMAS_DIR, cdc, order_placed, topic_size
from tests.traces import continues

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PLANT = "PAYLOAD-PLANT-5e1f"  # only ever in the payload: wherever it shows up, the payload was shown
INVOICE_V1 = {
    "type": "record",
    "name": "InvoiceIssued",
    "namespace": "outbox.events",
    "fields": [
        {"name": "invoice_id", "type": "string"},
        {"name": "amount_cents", "type": "long"},
        {"name": "note", "type": "string"},
    ],
}


def committed_offsets(bootstrap, topic):
    consumer = Consumer({**client_config(bootstrap), "group.id": f"cdc-dlq-{topic}"})
    try:
        tps = [TopicPartition(topic, p) for p in range(3)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def drop_group(kafka_admin, topic):
    for future in kafka_admin.delete_consumer_groups([f"cdc-dlq-{topic}"], request_timeout=10).values():
        try:
            future.result(timeout=10)
        except Exception:  # no such group (nothing was committed): nothing to clean up
            pass


def test_a_schema_fix_then_replay_publishes_the_event_once_and_the_hopeless_one_stays(
    outbox, pipeline_process, consume, kafka_bootstrap, kafka_admin, tmp_path
):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    env = {**outbox.env, "CDC_SCHEMAS_DIR": str(schemas)}
    proc = pipeline_process(CDC_SCHEMAS_DIR=str(schemas))
    proc.wait_streaming()
    invoice = outbox.event(
        "inv-1",
        {"invoice_id": "INV-1", "amount_cents": 4200, "note": PLANT},
        event_type="InvoiceIssued",
        aggregate_type="invoice",
        headers={"traceparent": TRACEPARENT},
    )
    hopeless = outbox.event("o-bad", order_placed("o-bad", amount_cents="many"))
    txn = outbox.commit([outbox.event("o-1"), invoice, hopeless, outbox.event("o-2")])
    dead = {r.headers["id"].decode(): r for r in consume(outbox.dlq_topic, 2)}
    assert set(dead) == {invoice.id, hopeless.id}
    orders = consume(outbox.topic("order"), 2)
    assert len(orders) == 2, "the good events went on"
    dead_invoice = dead[invoice.id]
    try:
        listed = cdc(env, "dlq", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["id"]: row for row in json.loads(listed.stdout)}
        assert set(rows) == {invoice.id, hopeless.id}
        assert rows[invoice.id]["reason"] == "schema_not_found"
        assert rows[invoice.id]["event_type"] == "InvoiceIssued"
        assert rows[invoice.id]["position"] == f"{dead_invoice.partition}:{dead_invoice.offset}"
        assert rows[hopeless.id]["reason"] == "payload_invalid"
        table = cdc(env, "dlq", "list")
        assert table.returncode == 0, table.stderr
        assert {invoice.id, hopeless.id, "schema_not_found", "payload_invalid"} <= set(table.stdout.split())
        assert PLANT not in listed.stdout + table.stdout

        shown = cdc(env, "dlq", "show", invoice.id)
        assert shown.returncode == 0, shown.stderr
        assert "error_reason: schema_not_found" in shown.stdout
        shown_trace = re.search(r"^\s*traceparent: (\S+)$", shown.stdout, re.M)
        assert shown_trace and continues(shown_trace[1], TRACEPARENT), shown.stdout
        assert f"xid: {txn.xid}" in shown.stdout
        assert PLANT not in shown.stdout + shown.stderr
        with_payload = cdc(env, "dlq", "show", invoice.id, "--payload")
        assert with_payload.returncode == 0 and PLANT in with_payload.stdout
        by_position = cdc(env, "dlq", "show", rows[invoice.id]["position"], "--payload", "--json")
        assert by_position.returncode == 0, by_position.stderr
        assert json.loads(by_position.stdout)["payload"] == invoice.payload

        # A first try with a schema Avro refuses (a field name with a dash): replay refuses the directory
        # as `cdc run` would, and publishes nothing.
        (schemas / "InvoiceIssued").mkdir()
        broken = {**INVOICE_V1, "fields": [*INVOICE_V1["fields"], {"name": "due-date", "type": "string"}]}
        (schemas / "InvoiceIssued" / "v1.avsc").write_text(json.dumps(broken))
        refused = cdc(env, "dlq", "replay", "--all")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "fails `cdc schemas check`" in refused.stderr and "InvoiceIssued" in refused.stderr
        assert topic_size(kafka_bootstrap, outbox.topic("invoice")) == 0

        # The fix: the schema the event was written for.
        (schemas / "InvoiceIssued" / "v1.avsc").write_text(json.dumps(INVOICE_V1))
        replay = cdc(env, "dlq", "replay", "--all")
        assert replay.returncode == 1, replay.stdout + replay.stderr
        lines = replay.stdout.splitlines()
        expected = sorted(
            [
                (
                    (dead_invoice.partition, dead_invoice.offset),
                    f"replayed {invoice.id} to {outbox.topic('invoice')}",
                ),
                (
                    (dead[hopeless.id].partition, dead[hopeless.id].offset),
                    f"still failing {hopeless.id}: payload_invalid: ",
                ),
            ]
        )
        assert len(lines) == 2, lines
        for line, (_, start) in zip(
            lines, expected, strict=True
        ):  # one line per record, in (partition, offset) order
            assert line.startswith(start), lines
        assert PLANT not in replay.stdout + replay.stderr

        arrived = consume(outbox.topic("invoice"), 1)
        assert len(arrived) == 1
        record = arrived[0]
        assert record.key == b"inv-1"
        partitions = len(
            kafka_admin.list_topics(outbox.topic("invoice"), timeout=10)
            .topics[outbox.topic("invoice")]
            .partitions
        )
        assert record.partition == java_partition(b"inv-1", partitions), "where the pipeline puts inv-1"
        assert record.timestamp_ms == orders[0].timestamp_ms, "the commit time, as its transaction's others"
        for name in (
            "id",
            "event_type",
            "schema_version",
            "aggregate_type",
            "commit_lsn",
            "xid",
            "traceparent",
        ):
            assert record.headers[name] == dead_invoice.headers[name], name
        assert record.headers["xid"] == str(txn.xid).encode()
        assert record.headers["id"] == invoice.id.encode()
        assert record.headers["cdc_replayed_from"] == (
            f"{outbox.dlq_topic}:{dead_invoice.partition}:{dead_invoice.offset}".encode()
        )
        assert not {"error_class", "error_reason", "error_message", "original_topic"} & set(record.headers)
        stored = SchemaStore(schemas).get("InvoiceIssued", 1)
        assert record.value[:10] == MAGIC + stored.fingerprint
        decoded = schemaless_reader(io.BytesIO(record.value[10:]), parse_schema(INVOICE_V1), None)
        assert decoded == invoice.payload

        after = cdc(env, "dlq", "list", "--json")
        assert after.returncode == 0, after.stderr
        assert [row["id"] for row in json.loads(after.stdout)] == [hopeless.id]
        # The bookmark: past the replayed record (and its marker), never past the one still failing.
        committed = committed_offsets(kafka_bootstrap, outbox.dlq_topic)
        assert committed[dead_invoice.partition] > dead_invoice.offset
        assert committed[dead[hopeless.id].partition] <= dead[hopeless.id].offset

        again = cdc(env, "dlq", "replay", "--all")
        assert again.returncode == 1
        assert again.stdout.splitlines() == [
            line for line in lines if line.startswith(f"still failing {hopeless.id}")
        ]
        assert topic_size(kafka_bootstrap, outbox.topic("invoice")) == 1, "replayed once only"
        assert proc.terminate() == 0
    finally:
        drop_group(kafka_admin, outbox.dlq_topic)


def test_a_too_large_record_cannot_be_replayed_and_unknown_ids_are_refused(
    outbox, pipeline_process, consume, kafka_bootstrap, kafka_admin, unique_name
):
    proc = pipeline_process()
    proc.wait_streaming()
    big = order_placed("o-big")
    big["customer_id"] = (
        "c" * 2_000_000
    )  # above the producer's message.max.bytes: dead-lettered without payload
    txn = outbox.commit([outbox.event("b-1", big)])
    dead = consume(outbox.dlq_topic, 1)
    assert len(dead) == 1 and dead[0].headers["error_reason"] == b"too_large"
    big_id = txn.ids[0]
    try:
        replay = cdc(outbox.env, "dlq", "replay", big_id)
        assert replay.returncode == 1, replay.stdout + replay.stderr
        assert replay.stdout.splitlines() == [
            f"still failing {big_id}: too_large: the dead-letter record has no payload "
            "(none is kept for this reason)"
        ]
        listed = cdc(outbox.env, "dlq", "list", "--json")
        assert [row["id"] for row in json.loads(listed.stdout)] == [big_id], "it stays"
        assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 1, "no marker was written"

        for command in (("show", "no-such-id"), ("replay", "no-such-id", big_id), ("show", "0:99")):
            unknown = cdc(outbox.env, "dlq", *command)
            assert unknown.returncode == 1
            assert unknown.stderr.strip().splitlines() == [
                f"cdc: error: no unresolved dead-letter record with id {command[1]}; "
                "`cdc dlq list` shows them"
            ]
            assert unknown.stdout == ""

        usage = cdc(outbox.env, "dlq", "replay")
        assert usage.returncode == 2
        missing_topic = unique_name("nodlq")
        missing = cdc({**outbox.env, "CDC_DLQ_TOPIC": missing_topic}, "dlq", "list")
        assert missing.returncode == 1
        assert f"'{missing_topic}' does not exist at {kafka_bootstrap}" in missing.stderr
        assert proc.terminate() == 0
    finally:
        drop_group(kafka_admin, outbox.dlq_topic)


def test_discard_resolves_without_a_replay_and_list_counts_what_is_unresolved_per_reason(
    outbox, pipeline_process, consume, kafka_bootstrap, kafka_admin
):
    proc = pipeline_process()
    proc.wait_streaming()
    bad = [outbox.event(f"d-{i}", order_placed(f"d-{i}", amount_cents="many")) for i in range(3)]
    unknown = outbox.event("d-x", {"x": 1}, event_type="NoSuchEvent")
    outbox.commit([*bad, unknown])
    assert len(consume(outbox.dlq_topic, 4)) == 4
    try:
        summary = cdc(outbox.env, "dlq", "list", "--summary", "--json")
        assert summary.returncode == 0, summary.stderr
        assert json.loads(summary.stdout) == {"payload_invalid": 3, "schema_not_found": 1}
        table = cdc(outbox.env, "dlq", "list")
        assert table.returncode == 0, table.stderr
        tail = [line.split() for line in table.stdout.splitlines()[-4:]]
        assert tail == [
            ["REASON", "UNRESOLVED"],
            ["payload_invalid", "3"],
            ["schema_not_found", "1"],
            ["total", "4"],
        ]
        assert len(json.loads(cdc(outbox.env, "dlq", "list", "--json").stdout)) == 4, "--json: the rows"

        # Read before the discard: afterwards the first 4 records read may include its markers.
        originals = {
            r.headers["id"]: (r.partition, r.offset) for r in read_topic(kafka_bootstrap, outbox.dlq_topic, 4)
        }
        gone = cdc(
            outbox.env,
            "dlq",
            "discard",
            bad[0].id,
            bad[1].id,
            "--reason",
            "test rows, never real",
            "--by",
            "alice",
        )
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.splitlines() == [
            f"discarded {e.id} (payload_invalid)"
            for e in sorted(bad[:2], key=lambda e: originals[e.id.encode()])
        ]
        assert topic_size(kafka_bootstrap, outbox.topic("order")) == 0, "nothing published"
        after = cdc(outbox.env, "dlq", "list", "--summary", "--json")
        assert json.loads(after.stdout) == {"payload_invalid": 1, "schema_not_found": 1}
        mine = cdc(outbox.env, "dlq", "discard", unknown.id, "--reason", "type given up")
        assert mine.returncode == 0, mine.stderr

        shown = cdc(outbox.env, "dlq", "show", bad[0].id)
        assert shown.returncode == 0, shown.stderr
        line = next(line for line in shown.stdout.splitlines() if line.startswith("resolution: "))
        assert line.startswith("resolution: discarded by alice at ")
        assert line.endswith(": test rows, never real")
        detail = json.loads(cdc(outbox.env, "dlq", "show", unknown.id, "--json").stdout)["resolution"]
        assert detail["outcome"] == "discarded" and detail["reason"] == "type given up"
        assert detail["by"] == who(), "the OS user by default"
        open_one = cdc(outbox.env, "dlq", "show", bad[2].id)
        assert "resolution: unresolved" in open_one.stdout

        # The markers: told apart from a replay's by their headers.
        records = read_topic(kafka_bootstrap, outbox.dlq_topic, 7)
        markers = [r for r in records if "cdc_dlq_resolved" in r.headers]
        assert len(markers) == 3
        assert all(r.value is None and "replayed_to" not in r.headers for r in markers)
        assert {r.headers["discarded_by"] for r in markers} == {b"alice", who().encode()}

        again = cdc(outbox.env, "dlq", "discard", bad[0].id, "--reason", "twice")
        assert again.returncode == 1
        assert again.stderr.strip() == (
            f"cdc: error: no unresolved dead-letter record with id {bad[0].id}; `cdc dlq list` shows them"
        )
        blank = cdc(outbox.env, "dlq", "discard", bad[2].id, "--reason", "  ")
        assert blank.returncode == 1 and "a discard needs a reason" in blank.stderr
        assert cdc(outbox.env, "dlq", "discard", bad[2].id).returncode == 2, "--reason is required"
        assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 7, "no marker for a refused discard"
        assert proc.terminate() == 0
    finally:
        drop_group(kafka_admin, outbox.dlq_topic)


def test_a_replayed_event_is_stamped_with_its_commit_time_not_the_dead_letters(
    outbox, pipeline_process, consume, kafka_admin, tmp_path
):
    """Issue 42, item 5: the dead letter is written when the pipeline reads the event (here 2 s after the
    commit, the pipeline being down); its replay carries the commit time, the `commit_time` header, as the
    records `cdc run` published from the same transaction do, for consumers' event-time logic."""
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    env = {**outbox.env, "CDC_SCHEMAS_DIR": str(schemas)}
    invoice = outbox.event(
        "inv-2",
        {"invoice_id": "INV-2", "amount_cents": 1, "note": "n"},
        event_type="InvoiceIssued",
        aggregate_type="invoice",
    )
    txn = outbox.commit([outbox.event("o-1"), invoice])
    row = outbox.conn.execute(
        "SELECT (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000)::bigint FROM "
        + f'"{outbox.table}" WHERE id = %s',
        (invoice.id,),
    ).fetchone()
    assert row is not None
    commit_ms = int(row[0])
    time.sleep(2)
    proc = pipeline_process(CDC_SCHEMAS_DIR=str(schemas))
    proc.wait_streaming()
    try:
        (dead,) = consume(outbox.dlq_topic, 1)
        (published,) = consume(outbox.topic("order"), 1)
        assert published.timestamp_ms // 1000 == commit_ms // 1000  # what cdc run writes: the commit time
        assert dead.timestamp_ms - published.timestamp_ms >= 1500  # the dead letter's: when it was written
        assert dead.headers["xid"] == str(txn.xid).encode()

        (schemas / "InvoiceIssued").mkdir()
        (schemas / "InvoiceIssued" / "v1.avsc").write_text(json.dumps(INVOICE_V1))
        replayed = cdc(env, "dlq", "replay", invoice.id)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        (record,) = consume(outbox.topic("invoice"), 1)
        assert record.timestamp_ms == published.timestamp_ms
        header = datetime.fromisoformat(dead.headers["commit_time"].decode())
        assert record.timestamp_ms == (header - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
        assert proc.terminate() == 0
    finally:
        drop_group(kafka_admin, outbox.dlq_topic)
