"""The fixtures against the real services: if these fail, every other integration test is meaningless."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from psycopg import sql

from tests.kafka_admin import create_topics, settled
from tests.plugins.kafka import client_config
from tests.plugins.pipeline import free_port
from tests.plugins.registry import registry_client_config, registry_get

ROOT = Path(__file__).resolve().parents[2]


def test_postgres_round_trips_a_row(pg_conn, table_name):
    pg_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, body text)").format(sql.Identifier(table_name))
    )
    marker = uuid.uuid4().hex
    pg_conn.execute(sql.SQL("INSERT INTO {} VALUES (1, %s)").format(sql.Identifier(table_name)), (marker,))
    row = pg_conn.execute(
        sql.SQL("SELECT body FROM {} WHERE id = 1").format(sql.Identifier(table_name))
    ).fetchone()
    assert row == (marker,)


def test_logical_slot_is_created_read_and_dropped(
    pg_conn, pg_database, table_name, publication_name, slot_name
):
    table = sql.Identifier(table_name)
    pg_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, body text)").format(table))
    pg_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(publication_name), table)
    )
    pg_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot_name,))
    marker = uuid.uuid4().hex
    pg_conn.execute(sql.SQL("INSERT INTO {} VALUES (7, %s)").format(table), (marker,))

    changes = pg_conn.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
        " 'proto_version', '1', 'publication_names', %s)",
        (slot_name, publication_name),
    ).fetchall()
    kinds = [bytes(data)[:1] for (data,) in changes]
    assert kinds == [b"B", b"R", b"I", b"C"]
    insert = bytes(changes[2][0])
    assert marker.encode() in insert

    pg_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
    left = pg_conn.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)
    ).fetchone()
    assert left == (0,)


def test_replication_connection_opens(pg_database):
    with psycopg.connect(pg_database, replication="database", autocommit=True) as conn:
        system = conn.execute("IDENTIFY_SYSTEM").fetchone()
    assert system is not None and system[3] is not None  # dbname: a database-bound replication connection


def test_kafka_produces_and_consumes(kafka_bootstrap, topic_factory, consume):
    topic = topic_factory(partitions=2)
    producer = Producer({**client_config(kafka_bootstrap), "enable.idempotence": True})
    sent = [(f"k{i}".encode(), uuid.uuid4().bytes) for i in range(10)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value, headers=[("h", key)])
    assert producer.flush(30) == 0

    records = consume(topic, n=len(sent), timeout=30)
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    assert all(r.headers["h"] == r.key for r in records)


def test_consume_stops_at_timeout_with_what_it_has(topic_factory, consume):
    topic = topic_factory()
    assert consume(topic, n=1, timeout=2) == []


def _avro(*fields: dict) -> Schema:
    record = {"type": "record", "name": "A", "namespace": "t", "fields": list(fields)}
    return Schema(json.dumps(record), "AVRO")


def test_schema_registry_answers(schema_registry_url):
    assert isinstance(registry_get(f"{schema_registry_url}/subjects"), list)
    assert "compatibilityLevel" in registry_get(f"{schema_registry_url}/config")


def test_schema_registry_registers_looks_up_and_enforces_compatibility(schema_registry_url, unique_name):
    subject = f"{unique_name('sr')}-value"
    v1 = _avro({"name": "x", "type": "int"})
    v2 = _avro({"name": "x", "type": "int"}, {"name": "y", "type": "string", "default": ""})
    with SchemaRegistryClient(registry_client_config(schema_registry_url)) as client:
        schema_id = client.register_schema(subject, v1)
        # The id the registry hands out is the one it serves the schema under (what a consumer of a framed
        # value asks for); a second client, so that the answer is not the first one's cache.
        with SchemaRegistryClient(registry_client_config(schema_registry_url)) as reader:
            assert json.loads(reader.get_schema(schema_id).schema_str) == json.loads(v1.schema_str)
        assert client.register_schema(subject, v1) == schema_id  # registering again changes nothing

        client.set_compatibility(subject, "BACKWARD")
        assert client.get_compatibility(subject) == "BACKWARD"
        found = client.lookup_schema(subject, v1)
        assert (found.schema_id, found.version) == (schema_id, 1)

        v2_id = client.register_schema(subject, v2)
        assert v2_id != schema_id
        with pytest.raises(SchemaRegistryError) as refused:  # x: int -> string cannot read v2's data
            client.register_schema(subject, _avro({"name": "x", "type": "string"}))
        assert refused.value.http_status_code == 409
        assert client.get_versions(subject) == [1, 2]

        # Confluent's ids: one per distinct schema, shared by every subject that registers it.
        assert client.register_schema(f"{unique_name('sr')}-value", v2) == v2_id


@pytest.mark.core
def test_the_stack_starts_a_standby_that_streams_and_syncs_failover_slots(tmp_path, pg_major):
    """`stack/stack.sh standby` on a stack of its own (same version, other ports): a physical standby of the
    cluster, and on 17+ set up to synchronize failover slots."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_STACK_DIR": str(tmp_path / "stack"),
        "CDC_STACK_PG_VERSION": str(pg_major),
        "CDC_STACK_PG_PORT": str(free_port()),
    }
    script = str(ROOT / "stack" / "stack.sh")
    try:
        done = subprocess.run(
            ["bash", script, "standby"], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        stack_env = (tmp_path / "stack" / "env").read_text()
        url = re.search(r"CDC_STACK_PG_FAILOVER_URL='([^']+)'", stack_env)
        assert url, stack_env
        with psycopg.connect(url.group(1), connect_timeout=5) as primary:
            assert primary.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            senders = primary.execute("SELECT count(*) FROM pg_stat_replication").fetchone()
            assert senders == (1,)
        standby_url = url.group(1).replace("target_session_attrs=read-write", "target_session_attrs=standby")
        with psycopg.connect(standby_url, connect_timeout=5) as standby:
            assert standby.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            if pg_major >= 17:
                assert standby.execute("SHOW sync_replication_slots").fetchone() == ("on",)
    finally:
        subprocess.run(["bash", script, "clean"], env=env, capture_output=True, timeout=300)


@contextmanager
def private_checkout(env: dict[str, str]) -> Iterator[tuple[Path, Path, str]]:
    """``(private, checkout, stack.sh)``: the stack's scripts copied under a fresh directory of /root (mode
    700, which the postgres user cannot enter); afterwards the stack `clean`ed with ``env`` and the cluster
    it moved to /var/tmp removed."""
    private = Path(tempfile.mkdtemp(prefix="cdc-private-", dir="/root"))
    checkout = private / "checkout"
    shutil.copytree(ROOT / "stack", checkout / "stack")
    script = str(checkout / "stack" / "stack.sh")
    try:
        yield private, checkout, script
    finally:
        subprocess.run(["bash", script, "clean"], env=env, capture_output=True, timeout=300)
        base_file = checkout / ".stack" / "pg-base"
        if base_file.exists() and base_file.read_text().startswith("/var/tmp/outbox-cdc-"):
            shutil.rmtree(base_file.read_text().strip(), ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


@pytest.mark.skipif(
    os.getuid() != 0, reason="the case is root's: a checkout that the postgres user cannot enter"
)
@pytest.mark.parametrize("secure", ["0", "1"], ids=["plain", "secure"])
def test_the_stack_starts_another_version_and_a_standby_from_a_checkout_postgres_cannot_enter(
    tmp_path, secure
):
    """As root, in a checkout under a directory of mode 700 (a clone under /root on a fresh server), the
    server runs as 'postgres', which cannot enter it: the cluster and the unpacked server binaries of a
    Maven-fetched version (13) must both live elsewhere (/var/tmp/outbox-cdc-*). The secure stack's server
    certificate and CA too (copied into the data directory), and its standby streams over TLS."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_STACK_PG_VERSION": "13",
        "CDC_STACK_SECURE": secure,
        "CDC_STACK_PG_PORT": str(free_port()),
    }
    with private_checkout(env) as (private, checkout, script):
        assert subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(private)]).returncode != 0
        for command in ("postgres", "standby"):  # `postgres` starts the cluster as `up` does
            done = subprocess.run(
                ["bash", script, command], env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stdout + done.stderr
        base = (checkout / ".stack" / "pg-base").read_text().strip()
        assert base.startswith("/var/tmp/outbox-cdc-"), base
        stack_env = (checkout / ".stack" / "env").read_text()
        url = re.search(r"CDC_STACK_PG_FAILOVER_URL='([^']+)'", stack_env)
        assert url, stack_env
        with psycopg.connect(url.group(1), connect_timeout=5) as primary:
            assert primary.execute("SHOW server_version_num").fetchone()[0].startswith("13")  # type: ignore[index]
            assert primary.execute("SELECT count(*) FROM pg_stat_replication").fetchone() == (1,)
            if secure == "1":
                assert "sslmode=verify-full" in url.group(1)
                assert primary.execute(
                    "SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_replication USING (pid)"
                ).fetchone() == (True,), "the standby streams over TLS"


def _free_port_block(span: int) -> int:
    """A port P with P .. P + span free (the cluster's brokers take P, P + 10, P + 20 and each + 5), below the
    kernel's ephemeral range: a port taken there with free_port() can be a client socket's local port a
    moment later (a broker once failed to bind one of its listeners so)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    for _ in range(200):
        base = random.randrange(20_000, max(ephemeral - span - 1, 20_001))
        if all(_bindable(base + i) for i in range(span + 1)):
            return base
    raise AssertionError("no block of free ports")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _stack_env(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)='([^']*)'$", path.read_text(), flags=re.MULTILINE))


@pytest.mark.skipif(
    os.getuid() != 0, reason="the case is root's: a checkout that the postgres user cannot enter"
)
def test_the_stack_starts_a_secure_three_broker_cluster_from_a_checkout_postgres_cannot_enter():
    """The three-broker mode combined with the secure one, as root from a checkout of mode 700: the whole
    stack (PostgreSQL over TLS, three SASL_SSL brokers and their controller, the registry on HTTPS) starts,
    and a topic made through it has three replicas and min.insync.replicas = 2, written and read as the
    stack's users."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_STACK_SECURE": "1",
        "CDC_STACK_KAFKA_BROKERS": "3",
        # One block for all: the brokers' P .. P + 25, then the controller, the registry and PostgreSQL.
        "CDC_STACK_KAFKA_PORT": str(base := _free_port_block(34)),
        "CDC_STACK_KAFKA_CONTROLLER_PORT": str(base + 30),
        "CDC_STACK_REGISTRY_PORT": str(base + 32),
        "CDC_STACK_PG_PORT": str(base + 34),
    }
    with private_checkout(env) as (_, checkout, script):
        done = subprocess.run(["bash", script, "up"], env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        stack = _stack_env(checkout / ".stack" / "env")
        assert (checkout / ".stack" / "pg-base").read_text().startswith("/var/tmp/outbox-cdc-")
        with psycopg.connect(stack["CDC_DATABASE_URL"], connect_timeout=5) as conn:
            tls = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
            assert tls == (True,)
        bootstrap = stack["CDC_KAFKA_BOOTSTRAP_SERVERS"]
        assert len(bootstrap.split(",")) == 3 and stack["CDC_TOPIC_REPLICATION_FACTOR"] == "3"
        secured = {
            "bootstrap.servers": bootstrap,
            "security.protocol": stack["CDC_KAFKA_SECURITY_PROTOCOL"],
            "sasl.mechanism": stack["CDC_KAFKA_SASL_MECHANISM"],
            "ssl.ca.location": stack["CDC_KAFKA_SSL_CA_LOCATION"],
        }
        admin = AdminClient(
            {
                **secured,
                "sasl.username": stack["CDC_STACK_KAFKA_ADMIN_USERNAME"],
                "sasl.password": stack["CDC_STACK_KAFKA_ADMIN_PASSWORD"],
            }
        )
        topic = f"cdc_cluster_{uuid.uuid4().hex[:8]}"
        create_topics(admin, [NewTopic(topic, num_partitions=3)])
        # The broker that answers may learn the new topic's partitions from the controller a moment after
        # the creation returned: asked again, within a bound, until it knows them.
        deadline = time.monotonic() + 30
        while True:
            metadata = admin.list_topics(topic, timeout=30).topics[topic]
            if len(metadata.partitions) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [len(p.replicas) for p in metadata.partitions.values()] == [3, 3, 3]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        described = settled(
            lambda left: admin.describe_configs([resource])[resource].result(timeout=left), "describe configs"
        )
        assert described["min.insync.replicas"].value == "2"
        producer = Producer(
            {
                **secured,
                "sasl.username": stack["CDC_KAFKA_SASL_USERNAME"],
                "sasl.password": stack["CDC_KAFKA_SASL_PASSWORD"],
                "acks": "all",
            }
        )
        producer.produce(topic, key=b"k", value=b"v")
        assert producer.flush(60) == 0
        request = urllib.request.Request(stack["CDC_SCHEMA_REGISTRY_URL"] + "/subjects")
        context = ssl.create_default_context(cafile=stack["CDC_SCHEMA_REGISTRY_CA_FILE"])
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            assert answer.status == 200
