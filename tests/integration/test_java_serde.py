"""A standard Java serde reads what `cdc run` publishes with value_format = "confluent" (issue 26 item 4):
Kafka's KafkaConsumer with Apicurio Registry's AvroKafkaDeserializer in its Confluent-compatible mode, from
Maven Central, configured as docs/operations.md says ("Reading the topics from Java"), no code of ours.

Every record must come back as it was written: the serde resolves the writer schema from the id in the
framing, decodes the value, and SerdeConsume writes it again with that schema; the bytes must equal the
record's body. The payload is the Payment schema of test_payload_forms (every logical type, fixed, bytes)."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.integration.test_payload_forms import emit_rows, payment_schemas, rows, write_sql_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.plain("Apicurio's Java serde is run without TLS or SASL settings"),
]

__all__ = ["payment_schemas"]  # the fixture, shared


def native_api(ccompat_url: str) -> str:
    """Apicurio's own API beside its Confluent-compatible one: what its serde is given."""
    return ccompat_url.split("/apis/", 1)[0] + "/apis/registry/v2"


def register_decoys(ccompat_url: str, subjects: int = 3) -> None:
    """One new schema under several subjects: the registry's global ids (one per version) move ahead of its
    content ids (one per distinct schema): a serde reading the framing's id as the wrong kind then fails."""
    schema = {"type": "record", "name": f"Decoy_{uuid.uuid4().hex}", "fields": [{"name": "x", "type": "int"}]}
    body = json.dumps({"schema": json.dumps(schema)}).encode()
    for i in range(subjects):
        request = urllib.request.Request(
            f"{ccompat_url}/subjects/decoy-{uuid.uuid4().hex}-{i}/versions",
            data=body,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


def make_unique(schemas: Path) -> None:
    """A Payment schema no other run registered: a content id of its own."""
    path = schemas / "Payment" / "v1.avsc"
    schema = json.loads(path.read_text())
    schema["doc"] = f"test_java_serde {uuid.uuid4()}"
    path.write_text(json.dumps(schema))


def test_apicurios_avro_serde_reads_every_record_as_it_was_written(
    outbox, pipeline_process, consume, java_serde, payment_schemas, schema_registry_url, kafka_bootstrap
):
    register_decoys(schema_registry_url)
    make_unique(payment_schemas)
    proc = pipeline_process(
        CDC_SCHEMAS_DIR=str(payment_schemas),
        CDC_VALUE_FORMAT="confluent",
        CDC_SCHEMA_REGISTRY_URL=schema_registry_url,
    )
    proc.wait_streaming()
    source = rows()
    ids = write_sql_rows(outbox, source, messages=False) + emit_rows(outbox, payment_schemas, source)
    topic = outbox.topic("payment")
    records = consume(topic, len(ids), timeout=90)
    assert {r.headers["id"].decode() for r in records} == set(ids)
    java = java_serde.read(kafka_bootstrap, topic, native_api(schema_registry_url), len(records))
    assert len(java) == len(records)
    for record in records:
        assert record.value is not None and record.value[0] == 0, "Confluent framing: magic byte 0"
        schema, body = java[record.partition, record.offset]
        assert schema == "outbox.events.Payment"
        assert body == record.value[5:], f"{record.headers['id']!r} read otherwise by the serde"
    assert proc.terminate() == 0
