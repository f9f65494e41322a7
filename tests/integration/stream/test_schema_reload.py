"""A worker that lives for days takes new schemas without a restart: a version added while `cdc run` streams
is published, not dead-lettered (the directory is re-read on the miss); one that `cdc schemas check` refuses
is not used, its events are dead-lettered and the stream goes on; SIGHUP re-reads the directory at once."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest

from cdc.avro.reload import RELOAD_GAP
from cdc.avro.store import SchemaStore
from tests.integration.stream.test_pipeline import decode_value
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed, topic_size

pytestmark = pytest.mark.integration


def write_version(schemas: Path, version: int, *fields: dict[str, object]) -> None:
    schema = json.loads((SCHEMAS_DIR / "OrderPlaced" / "v2.avsc").read_text())
    schema["fields"] += list(fields)
    (schemas / "OrderPlaced" / f"v{version}.avsc").write_text(json.dumps(schema))


CHANNEL = {"name": "channel", "type": ["null", "string"], "default": None}
REGION_REQUIRED = {"name": "region", "type": "string"}  # no default: v4 could not read v3's data
REGION = {"name": "region", "type": "string", "default": "eu"}


def test_a_version_added_while_streaming_is_published_a_broken_one_is_not_and_sighup_rereads(
    outbox, pipeline_process, consume, kafka_bootstrap, tmp_path: Path
):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    proc = pipeline_process(CDC_SCHEMAS_DIR=str(schemas))
    proc.wait_streaming()
    topic = outbox.topic("order")
    outbox.commit([outbox.event("o-1", order_placed("o-1"), schema_version=2)])
    assert len(consume(topic, 1)) == 1

    write_version(schemas, 3, CHANNEL)  # the deploy adds v3 beside the running worker
    v3 = {**order_placed("o-2"), "channel": "web"}
    added = outbox.event("o-2", v3, schema_version=3)
    outbox.commit([added])
    [record] = [r for r in consume(topic, 2) if r.headers["id"] == added.id.encode()]
    assert record.headers["schema_version"] == b"3"
    assert decode_value(SchemaStore(schemas), record.value) == ("OrderPlaced", 3, {**v3, "coupon": None})
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0, "published, not dead-lettered"
    proc.wait_for_log(
        r"re-read \S+ \(no schema loaded for 'OrderPlaced' v3\): 5 schemas, new: OrderPlaced v3"
    )
    time.sleep(RELOAD_GAP)  # the throttle: misses re-read at most once a second in all

    write_version(schemas, 4, CHANNEL, REGION_REQUIRED)  # fails BACKWARD: not used
    v4 = {**v3, "region": "us"}
    broken = outbox.event("o-3", v4, schema_version=4)
    outbox.commit([broken, outbox.event("o-4", v3, schema_version=3)])
    dead = consume(outbox.dlq_topic, 1)
    assert dead[0].headers["id"] == broken.id.encode()
    assert dead[0].headers["error_reason"] == b"schema_not_found"
    message = dead[0].headers["error_message"].decode()
    assert "no schema for OrderPlaced v4 among the 5 loaded from" in message
    assert "that re-read was not used: " in message and "region" in message
    assert len(consume(topic, 3)) == 3, "the stream went on"
    proc.wait_for_log(r"kept the 5 schemas loaded before: it fails `cdc schemas check` \(BACKWARD\)")

    write_version(schemas, 4, CHANNEL, REGION)  # fixed; SIGHUP, within the miss's throttle interval
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_for_log(r"re-read \S+ \(SIGHUP\): 6 schemas, new: OrderPlaced v4")
    fixed = outbox.event("o-5", v4, schema_version=4)
    outbox.commit([fixed])
    # The topic has 3 partitions: records come partition by partition, so find it by its id.
    [record] = [r for r in consume(topic, 4) if r.headers["id"] == fixed.id.encode()]
    assert decode_value(SchemaStore(schemas), record.value) == ("OrderPlaced", 4, {**v4, "coupon": None})
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 1
    assert proc.alive()
    assert proc.terminate() == 0


def test_a_schemas_dir_that_fails_the_check_is_a_refusal_to_start(outbox, pipeline_process, tmp_path: Path):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, schemas)
    write_version(schemas, 3, REGION_REQUIRED)
    proc = pipeline_process(CDC_SCHEMAS_DIR=str(schemas))
    assert proc.wait(60) == 2
    lines = [line for line in proc.log().splitlines() if line.startswith("cdc: error:")]
    assert len(lines) == 1, proc.log()
    assert lines[0].startswith(f"cdc: error: setting 'schemas_dir': {schemas} fails `cdc schemas check`")
