"""cdc.consumer.IdempotentConsumer against the real Kafka and PostgreSQL, through the example invoice service.

Each test runs the service as subprocesses (`examples.invoice_service`, or
`tests.integration.consumer.invoice_faults` for injected faults) on a topic, consumer group, dead-letter topic
and tables of its own, produces records the way the pipeline does (single-object Avro values, the pipeline's
headers), and judges by the invoices table, processed_events and the group's committed offsets. The invoices
table has no unique constraint: only the processed_events guard keeps invoices single
(`test_without_the_guard_...` shows the tests would see it)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from psycopg import sql

from cdc.avro.encoder import AvroEncoder, confluent_header
from cdc.avro.registry import SchemaRegistry
from cdc.avro.store import SchemaStore
from cdc.config import TableRef
from cdc.consumer.processed import apply_setup, mark_many, mark_processed
from cdc.outbox import emit
from tests.kafka_admin import settled
from tests.plugins.kafka import (
    client_config,
    create_topic,
    delete_topics,
    kafka_security_env,
    with_stack_security,
)
from tests.plugins.pipeline import (
    SCHEMAS_DIR,
    ModuleProcess,
    _env_for,
    _register,
    cdc,
    order_placed,
    topic_size,
    wait_until,
)
from tests.plugins.registry import registry_ca, registry_client_config

FAULTS = "tests.integration.consumer.invoice_faults"
EXAMPLE = "examples.invoice_service"
# A killed member is noticed within seconds rather than the default 45 s; metadata of a topic the pipeline
# creates later is noticed within a second.
FAST_GROUP = [
    "-X",
    "session.timeout.ms=6000",
    "-X",
    "heartbeat.interval.ms=1000",
    "-X",
    "topic.metadata.refresh.interval.ms=1000",
]
ENCODER = AvroEncoder(SchemaStore(SCHEMAS_DIR))


def service_user_env(bootstrap: str) -> dict[str, str]:
    """On the secure stack, the service connects as the `consumer` user (examples/invoice_service.py)."""
    if not kafka_security_env(bootstrap):
        return {}
    return {
        "INVOICE_KAFKA_SASL_USERNAME": os.environ["CDC_STACK_KAFKA_CONSUMER_USERNAME"],
        "INVOICE_KAFKA_SASL_PASSWORD": os.environ["CDC_STACK_KAFKA_CONSUMER_PASSWORD"],
    }


@dataclass
class Order:
    """One OrderPlaced record: `order_id` is the Kafka key unless `key` says otherwise."""

    order_id: str
    amount_cents: int = 1250
    version: int = 1
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    key: str | None = None
    value: bytes | None = None  # raw bytes instead of the Avro encoding (an undecodable record)

    def payload(self) -> dict[str, Any]:
        body = order_placed(self.order_id, self.amount_cents)
        return {**body, "coupon": "WELCOME10"} if self.version == 2 else body


@dataclass
class Rig:
    dsn: str
    bootstrap: str
    admin: AdminClient
    topic: str
    dlq: str
    name: str
    invoices: str
    processed: str
    tmp_path: Path
    request: pytest.FixtureRequest
    services: list[ModuleProcess] = field(default_factory=list)

    def args(self, topic: str | None = None) -> list[str]:
        return [
            "--topic",
            topic or self.topic,
            "--name",
            self.name,
            "--dlq-topic",
            self.dlq,
            "--invoices-table",
            self.invoices,
            "--processed-table",
            self.processed,
            "--shutdown-timeout",
            "20",
            *FAST_GROUP,
        ]

    def start(self, module: str = FAULTS, *extra: str, topic: str | None = None, **env: str) -> ModuleProcess:
        environment = _env_for(
            with_stack_security(
                {
                    "INVOICE_DATABASE_URL": self.dsn,
                    "CDC_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                    "FAULT_DIR": str(self.tmp_path),
                    **service_user_env(self.bootstrap),
                    # For a registry URL given as an argument (the stack's, or a proxy of it).
                    **{k: v for k, v in os.environ.items() if k == "CDC_SCHEMA_REGISTRY_CA_FILE"},
                    **env,
                }
            )
        )
        log_path = self.tmp_path / f"service-{len(self.services) + 1}.log"
        service = ModuleProcess([module, *self.args(topic), *extra], environment, log_path, "invoice service")
        self.services.append(service)
        _register(self.request, service)
        return service

    def produce(self, orders: list[Order]) -> None:
        """As the pipeline publishes: single-object Avro, keyed by the aggregate id, its headers."""
        producer = Producer({**client_config(self.bootstrap), "enable.idempotence": True})
        for order in orders:
            value = order.value
            if value is None:
                value = ENCODER.encode("OrderPlaced", order.version, orjson.dumps(order.payload()))
            headers = [
                ("id", order.event_id.encode()),
                ("event_type", b"OrderPlaced"),
                ("schema_version", str(order.version).encode()),
                ("aggregate_type", b"order"),
            ]
            producer.produce(self.topic, key=order.key or order.order_id, value=value, headers=headers)
        assert producer.flush(30) == 0

    def invoices_per_order(self) -> dict[str, int]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT order_id, count(*) FROM {} GROUP BY order_id").format(
                    sql.Identifier(self.invoices)
                )
            ).fetchall()
        return {order_id: count for order_id, count in rows}

    def processed_ids(self) -> list[str]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT event_id FROM {} WHERE consumer = %s").format(sql.Identifier(self.processed)),
                (self.name,),
            ).fetchall()
        return [row[0] for row in rows]

    def committed(self, topic: str | None = None) -> int:
        """The group's committed offsets summed over the topic's partitions (= records acknowledged)."""
        topic = topic or self.topic
        partitions = self.admin.list_topics(topic, timeout=10).topics[topic].partitions
        consumer = Consumer({**client_config(self.bootstrap), "group.id": self.name})
        try:
            offsets = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        except KafkaException as exc:
            if not exc.args[0].retriable() and exc.args[0].code() != KafkaError.NOT_COORDINATOR:
                raise
            return -1  # the group's coordinator is moving or loading: ask again
        finally:
            consumer.close()
        return sum(max(tp.offset, 0) for tp in offsets)

    def wait_committed(self, n: int, timeout: float = 60.0, topic: str | None = None) -> None:
        wait_until(lambda: self.committed(topic) >= n, timeout, f"{n} committed offsets", interval=0.5)
        assert self.committed(topic) == n


@pytest.fixture
def rig(
    pg_database: str,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Rig]:
    # Names the secure stack's `consumer` user holds rights on (topics cdc_*, dlq_*, groups consumer_*).
    topic = unique_name("cdc_orders")
    create_topic(kafka_admin, topic, partitions=4)
    # Made by the operator, as on a cluster where the service's user may not create topics.
    dlq = unique_name("dlq_invoice")
    create_topic(kafka_admin, dlq, partitions=1)
    setup = Rig(
        dsn=pg_database,
        bootstrap=kafka_bootstrap,
        admin=kafka_admin,
        topic=topic,
        dlq=dlq,
        name=unique_name("consumer_invoice"),
        invoices=unique_name("invoices")[:63],
        processed=unique_name("processed")[:63],
        tmp_path=tmp_path,
        request=request,
    )
    try:
        yield setup
    finally:
        for service in setup.services:
            service.cleanup()
        delete_topics(kafka_admin, [topic, setup.dlq])


def test_the_same_record_twice_gives_one_invoice(rig):
    twice, other = Order("o-twice"), Order("o-other")
    rig.produce([twice, twice, other])
    service = rig.start()
    rig.wait_committed(3)
    assert rig.invoices_per_order() == {"o-twice": 1, "o-other": 1}
    assert sorted(rig.processed_ids()) == sorted([twice.event_id, other.event_id])
    service.wait_for_log(rf"event '{twice.event_id}' was processed before")
    assert service.terminate(30) == 0


def test_without_the_guard_the_same_record_twice_gives_two_invoices(rig):
    """The tests can fail: with processed_events short-circuited, the duplicate becomes a second invoice."""
    twice = Order("o-twice")
    rig.produce([twice, twice])
    rig.start(INVOICE_NO_GUARD="1")
    rig.wait_committed(2)
    assert rig.invoices_per_order() == {"o-twice": 2}


def test_two_processes_racing_through_rebalances_give_one_invoice_per_event(rig):
    """Two members of one group over 4 partitions; a third joins and leaves (SIGTERM) and one is killed
    (SIGKILL) and replaced while there is a backlog, and the producer re-publishes some events (same ids),
    as a pipeline restart would. Rebalances and the kill re-deliver records: still one invoice per event."""
    orders = [Order(f"o-{i:03d}") for i in range(300)]
    again = orders[:100:4] + orders[200:260:3]
    # ~12 events/s per member: the backlog lasts well beyond a new member's start-up (CPU-bound, so slow
    # on a loaded machine, while this delay is not), and the membership changes land mid-stream.
    slow = {"FAULT_DELAY_MS": "80"}
    first, second = rig.start(**slow), rig.start(**slow)
    rig.produce(orders[:250] + again)
    first.wait_for_log(r"invoiced order")
    third = rig.start(**slow)
    third.wait_for_log(r"invoiced order")  # it took over partitions with a backlog
    assert third.terminate(30) == 0  # leaves the group: its partitions go back to the others
    second.wait_for_log(r"invoiced order")
    second.kill()  # mid-record, perhaps between its database commit and its offset commit
    replacement = rig.start(**slow)
    replacement.wait_for_log(r"assigned \S+\[\d\]")
    rig.produce(orders[250:])
    replacement.wait_for_log(r"invoiced order")
    rig.wait_committed(len(orders) + len(again), timeout=120)
    invoices = rig.invoices_per_order()
    assert {k: v for k, v in invoices.items() if v != 1} == {}
    assert len(invoices) == len(orders)
    assert sorted(rig.processed_ids()) == sorted(o.event_id for o in orders)
    logs = [s.log() for s in (first, second, third, replacement)]
    assert sum(text.count("was processed before") for text in logs) >= len(again), "duplicates were seen"
    assert any(re.search(r"revoked \S+\[\d\]", text) for text in logs), "a rebalance moved partitions"
    assert first.terminate(30) == 0 and replacement.terminate(30) == 0


@pytest.mark.parametrize("fault", ["exit", "raise"])
def test_a_crash_between_the_effect_and_the_commit_is_retried_with_one_effect(rig, fault):
    crash, after = Order(f"{fault}-1", key="k"), Order("o-after", key="k")  # one partition, in this order
    rig.produce([crash, after])
    service = rig.start()
    assert service.wait(60) == (7 if fault == "exit" else 1)
    assert rig.invoices_per_order() == {}, "the invoice was rolled back with its transaction"
    assert rig.processed_ids() == [] and rig.committed() == 0
    if fault == "raise":
        assert "RuntimeError: injected crash" in service.log()
        assert "rolled back, offset not committed" in service.log()
    restarted = rig.start()
    rig.wait_committed(2)
    assert rig.invoices_per_order() == {f"{fault}-1": 1, "o-after": 1}
    assert restarted.terminate(30) == 0


def test_a_permanent_error_goes_to_the_dead_letter_topic_and_the_partition_moves_on(rig, consume):
    ok, zero, after = (Order(o, key="k") for o in ("o-1", "o-zero", "o-3"))
    zero.amount_cents = 0  # the example refuses to invoice it: PermanentError(reason="no_total")
    garbage = Order("o-garbage", key="k", value=b"\x00not avro at all")
    rig.produce([ok, zero, garbage, after])
    service = rig.start()
    rig.wait_committed(4)
    assert rig.invoices_per_order() == {"o-1": 1, "o-3": 1}
    assert sorted(rig.processed_ids()) == sorted([ok.event_id, after.event_id]), "dead letters not marked"
    letters = consume(rig.dlq, 2)
    assert len(letters) == 2
    first, second = letters
    h = {k: v.decode() for k, v in first.headers.items()}
    assert (h["error_class"], h["error_reason"]) == ("PermanentError", "no_total")
    assert h["error_message"] == "an order with a total of zero or less cannot be invoiced"
    source = {r.headers["id"].decode(): r for r in consume(rig.topic, 4)}[zero.event_id]
    assert (h["original_topic"], h["original_partition"]) == (rig.topic, str(source.partition))
    assert h["consumer"] == rig.name
    assert h["original_offset"] == "1"
    assert (h["id"], h["event_type"], h["schema_version"]) == (zero.event_id, "OrderPlaced", "1")
    assert first.key == b"k" and first.value == ENCODER.encode("OrderPlaced", 1, orjson.dumps(zero.payload()))
    h2 = {k: v.decode() for k, v in second.headers.items()}
    assert (h2["error_class"], h2["error_reason"], h2["original_offset"]) == (
        "DeserializationError",
        "undecodable",
        "2",
    )
    assert h2["id"] == garbage.event_id and second.value == garbage.value
    assert "c-o-zero" not in service.log(), "a payload value leaked into the log"
    assert service.terminate(30) == 0


def test_a_retryable_error_that_succeeds_on_the_third_attempt_gives_one_effect(rig):
    flaky = Order("flaky-1")
    rig.produce([flaky])
    service = rig.start()
    rig.wait_committed(1, timeout=60)
    assert rig.invoices_per_order() == {"flaky-1": 1}
    log = service.log()
    assert "RetryableError, attempt 1; retrying" in log and "RetryableError, attempt 2; retrying" in log
    assert "attempt 3" not in log
    assert service.terminate(30) == 0


@pytest.mark.parametrize("then", ["stop", "dead_letter"])
def test_retries_exhausted_stop_the_consumer_or_dead_letter_the_record(rig, consume, then):
    down, after = Order("down-1", key="k"), Order("o-after", key="k")
    rig.produce([down, after])
    service = rig.start(FAULTS, "--retry-attempts", "2", "--on-retries-exhausted", then)
    if then == "stop":
        assert service.wait(30) == 1
        assert "RetriesExhaustedError" in service.log() and "stopping, offset not committed" in service.log()
        assert rig.invoices_per_order() == {} and rig.committed() == 0
        return
    rig.wait_committed(2)
    assert rig.invoices_per_order() == {"o-after": 1}
    (letter,) = consume(rig.dlq, 1)
    assert letter.headers["error_reason"] == b"retries_exhausted"
    assert letter.headers["error_class"] == b"RetriesExhaustedError"
    assert b"still failing after 2 attempts" in letter.headers["error_message"]
    assert service.terminate(30) == 0


def test_sigterm_finishes_the_current_record_commits_and_exits_0(rig):
    slow, after = Order("slow-1", key="k"), Order("o-after", key="k")
    rig.produce([slow, after])
    service = rig.start(FAULT_SLOW="3")
    service.wait_for_log(r"slow handler started for slow-1")
    started = time.monotonic()
    assert service.terminate(20) == 0
    assert time.monotonic() - started < 10
    assert "slow handler finished for slow-1" in service.log()
    assert rig.invoices_per_order() == {"slow-1": 1}
    assert rig.committed() == 1, "the finished record is committed, the next one is left for later"
    restarted = rig.start()
    rig.wait_committed(2)
    assert rig.invoices_per_order() == {"slow-1": 1, "o-after": 1}
    assert restarted.terminate(30) == 0


def test_a_handler_that_outlasts_the_shutdown_bound_is_cut_off_unacknowledged(rig):
    rig.produce([Order("slow-1")])
    service = rig.start(FAULTS, "--shutdown-timeout", "2", FAULT_SLOW="60")
    service.wait_for_log(r"slow handler started for slow-1")
    started = time.monotonic()
    assert service.terminate(20) == 1
    assert time.monotonic() - started < 6
    assert "did not stop within 2 s: exiting 1" in service.log()
    assert rig.invoices_per_order() == {} and rig.committed() == 0, "nothing half-done was kept"


def test_end_to_end_app_transaction_to_one_invoice_per_order(rig, outbox, pipeline_process, consume):
    """The application commits an order and its OrderPlaced (v1 or v2) with cdc.outbox.emit; the pipeline
    publishes it; the invoice service creates one invoice per order, also when the pipeline republishes."""
    common = {"schemas": SCHEMAS_DIR, "table": outbox.settings.table, "columns": outbox.settings.columns}
    with psycopg.connect(outbox.dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY, amount_cents bigint)")
        for i in range(6):
            order_id = f"e2e-{i}"
            conn.execute("INSERT INTO orders VALUES (%s, %s)", (order_id, 1000 + i))
            payload = order_placed(order_id, 1000 + i)
            if i % 2:
                payload["coupon"] = "WELCOME10"
            emit(
                conn,
                aggregate_type="order",
                aggregate_id=order_id,
                event_type="OrderPlaced",
                payload=payload,
                schema_version=2 if i % 2 else 1,
                **common,
            )
            if i == 5:
                conn.rollback()  # the application changed its mind: no order, no event, no invoice
            else:
                conn.commit()
    topic = outbox.topic("order")
    pipeline = pipeline_process()
    pipeline.wait_streaming()
    wait_until(
        lambda: topic_size(outbox.settings.kafka.bootstrap_servers, topic) >= 5, 30, "5 events in Kafka"
    )
    service = rig.start(EXAMPLE, topic=topic)
    rig.wait_committed(5, topic=topic)
    assert rig.invoices_per_order() == {f"e2e-{i}": 1 for i in range(5)}
    # A pipeline restart republishes what it had not confirmed: the same records once more.
    again = consume(topic, 5)[:2]
    producer = Producer({**client_config(rig.bootstrap)})
    for r in again:
        producer.produce(
            topic, key=r.key, value=r.value, headers=list(r.headers.items()), partition=r.partition
        )
    assert producer.flush(30) == 0
    rig.wait_committed(7, topic=topic)
    assert rig.invoices_per_order() == {f"e2e-{i}": 1 for i in range(5)}
    assert pipeline.terminate() == 0 and service.terminate(30) == 0


def test_consumer_setup_and_prune_on_the_service_database(pg_database, unique_name):
    table = unique_name("processed")[:63]
    env = _env_for({"CDC_DATABASE_URL": pg_database})
    for _ in range(2):  # idempotent
        done = cdc(env, "consumer", "setup", "--processed-table", table)
        assert done.returncode == 0, done.stderr
    assert f"table public.{table}: ok" in done.stdout
    ident = sql.Identifier(table)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (event_id, consumer, processed_at) SELECT 'old-' || c || i, c,"
                " now() - interval '10 days' FROM generate_series(1, 5) i, unnest(ARRAY['a', 'b']) c"
            ).format(ident)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (event_id, consumer) VALUES ('new-a', 'a'), ('new-b', 'b')").format(ident)
        )

        def left() -> list[str]:
            return [r[0] for r in conn.execute(sql.SQL("SELECT event_id FROM {} ORDER BY 1").format(ident))]

        done = cdc(
            env,
            "consumer",
            "prune",
            "--processed-table",
            table,
            "--older-than",
            "7d",
            "--batch-size",
            "2",
            "--consumer",
            "a",
        )
        assert done.returncode == 0, done.stderr
        assert f"deleted 5 rows older than 7d from public.{table}" in done.stdout
        assert left() == ["new-a", "new-b", "old-b1", "old-b2", "old-b3", "old-b4", "old-b5"]
        with psycopg.connect(pg_database) as holder:  # a row locked by a writer is skipped, not waited for
            holder.execute(sql.SQL("SELECT 1 FROM {} WHERE event_id = 'old-b1' FOR UPDATE").format(ident))
            done = cdc(env, "consumer", "prune", "--processed-table", table, "--older-than", "7d", timeout=30)
            assert done.returncode == 0, done.stderr
            assert "deleted 4 rows" in done.stdout
        assert left() == ["new-a", "new-b", "old-b1"]
    bad = cdc(env, "consumer", "prune", "--processed-table", table, "--older-than", "soon")
    assert bad.returncode == 2 and "is not a duration" in bad.stderr


ODD_IDS = [
    'quote"d',
    "back\\slash\\",
    "comma,separated",
    "{braces}",
    "NULL",
    "",
    "  spaced  ",
    "new\nline\ttab",
    "üñí©ødé ✓ 🎉",
    "x" * 300,
]


def test_the_guard_of_a_batch_keeps_every_id_exactly_as_written(pg_database, unique_name):
    # A batch's ids travel as one JSON array: what a text[] literal or a JSON string treats specially (quotes,
    # backslashes, commas, braces, NULL, the empty string, control characters, non-ASCII) must come back as
    # the same id, new the first time and never again.
    table = TableRef(schema="public", name=unique_name("processed")[:63])
    apply_setup(pg_database, table)
    with psycopg.connect(pg_database) as conn:
        with conn.transaction():
            assert mark_many(conn, table, ODD_IDS, "invoices") == set(ODD_IDS)
        with conn.transaction():
            assert mark_many(conn, table, [*ODD_IDS, "fresh"], "invoices") == {"fresh"}
            assert not mark_processed(conn, table, ODD_IDS[0], "invoices")
        stored = conn.execute(
            sql.SQL("SELECT event_id FROM {}").format(sql.Identifier(table.schema, table.name))
        ).fetchall()
    assert sorted(r[0] for r in stored) == sorted([*ODD_IDS, "fresh"])


def test_a_registry_outage_makes_the_consumer_wait_not_dead_letter(rig, schema_registry_url, tcp_proxy):
    """A Confluent-framed record whose schema the consumer must fetch while the registry is down: it waits
    within the retry policy and processes the record once the registry answers; nothing is dead-lettered."""
    with SchemaRegistry(
        schema_registry_url, ENCODER.store, ca_file=registry_ca(schema_registry_url)
    ) as registry:
        schema_id = registry.schema_id(rig.topic, "OrderPlaced", 1)
    order = Order("o-reg")
    order.value = confluent_header(schema_id) + ENCODER.encode_body(
        "OrderPlaced", 1, orjson.dumps(order.payload())
    )
    rig.produce([order])
    target = urlsplit(schema_registry_url)
    proxy = tcp_proxy(target.hostname, target.port)
    proxy.stop()
    via_proxy = schema_registry_url.replace(f":{target.port}", f":{proxy.port}", 1)
    service = rig.start("examples.invoice_service", "--schema-registry-url", via_proxy)
    service.wait_for_log(r"schema registry .* failed fetching schema id \d+.*; attempt 2, retrying", 60)
    assert rig.committed() == 0 and rig.invoices_per_order() == {}
    proxy.start()
    rig.wait_committed(1)
    assert rig.invoices_per_order() == {"o-reg": 1}
    assert topic_size(rig.bootstrap, rig.dlq) == 0, "an outage is not the record's fault"
    assert service.terminate(30) == 0


def test_records_are_batched_and_a_failure_inside_a_batch_loses_nothing(rig):
    """Many records per transaction (an fsync per record would cap a service at a few hundred events/s),
    with a retryable failure, re-published duplicates and a crash in the middle of the stream: one
    invoice per order, and the records before the crash were committed before the process died."""
    orders = [Order(f"o-{i:03d}", key="k") for i in range(150)]  # one key: one partition, in this order
    flaky, crash = Order("flaky-b", key="k"), Order("raise-b", key="k")
    stream = orders[:60] + [flaky] + orders[60:100] + [orders[10], orders[70], orders[70]] + [crash]
    stream += orders[100:]
    rig.produce(stream)
    service = rig.start()
    assert service.wait(60) == 1, "the injected crash stops the first process"
    assert rig.committed() == stream.index(crash), "everything before the crash was committed"
    restarted = rig.start()
    rig.wait_committed(len(stream))
    invoices = rig.invoices_per_order()
    assert {k: v for k, v in invoices.items() if v != 1} == {}
    assert len(invoices) == len(orders) + 2
    with psycopg.connect(rig.dsn) as conn:
        rows, transactions = conn.execute(
            sql.SQL("SELECT count(*), count(DISTINCT processed_at) FROM {} WHERE consumer = %s").format(
                sql.Identifier(rig.processed)
            ),
            (rig.name,),
        ).fetchone()
    assert rows == len(orders) + 2
    assert transactions * 5 < rows, f"{rows} events in {transactions} transactions: not batched"
    log = service.log() + restarted.log()
    assert "RetryableError, attempt 2; retrying" in log and "attempt 3" not in log
    assert log.count("was processed before") >= 3
    assert restarted.terminate(30) == 0


def test_a_database_error_in_a_pipelined_batch_is_not_blamed_on_another_record(rig):
    """Handlers of a batch run in pipeline mode, where a statement's error surfaces at the next fetch: here
    a division by zero (once, as a serialization failure would) surfaces in the handler of the record after
    it, which turns it into that record's PermanentError. The batch is done again without the pipeline, so
    that record is invoiced, not dead-lettered (blaming it would skip a real event)."""
    orders = [Order(f"o-{i:02d}", key="k") for i in range(60)]  # one key: one partition, in this order
    culprit, reader = Order("divzero-a", key="k"), Order("fetch-b", key="k")
    stream = orders[:30] + [culprit, reader] + orders[30:]
    rig.produce(stream)
    service = rig.start()
    rig.wait_committed(len(stream))
    assert topic_size(rig.bootstrap, rig.dlq) == 0
    assert rig.invoices_per_order() == {o.order_id: 1 for o in [*orders, culprit, reader]}
    assert "done again without the pipeline" in service.log(), "the two were not in one pipelined batch"
    assert service.terminate(30) == 0


def test_a_batch_handler_invoices_a_batch_at_once_and_the_event_it_refuses_is_found_alone(rig, consume):
    """`--batch`: the example's batch handler invoices a batch's new events with one executemany. An order
    it refuses (PermanentError) rolls the whole batch back; the consumer halves the batch until that event
    is alone, dead-letters it, and invoices every other order once, redeliveries included, in few
    transactions."""
    orders = [Order(f"o-{i:03d}", key="k") for i in range(200)]  # one key: one partition, in this order
    zero = Order("o-zero", key="k", amount_cents=0)
    stream = orders[:110] + [zero] + orders[110:150] + [orders[5], orders[120]] + orders[150:]
    rig.produce(stream)
    service = rig.start(EXAMPLE, "--batch")
    rig.wait_committed(len(stream))
    assert rig.invoices_per_order() == {o.order_id: 1 for o in orders}
    assert [r.headers["id"].decode() for r in consume(rig.dlq, 1)] == [zero.event_id]
    assert sorted(rig.processed_ids()) == sorted(o.event_id for o in orders), "the dead letter not marked"
    with psycopg.connect(rig.dsn) as conn:
        (transactions,) = conn.execute(
            sql.SQL("SELECT count(DISTINCT processed_at) FROM {} WHERE consumer = %s").format(
                sql.Identifier(rig.processed)
            ),
            (rig.name,),
        ).fetchone()
    assert transactions * 5 < len(orders), f"{len(orders)} events in {transactions} transactions"
    log = service.log()
    assert "the batch handler raised PermanentError" in log, "the refused order was not in a batch"
    assert log.count("was processed before") >= 2
    assert service.terminate(30) == 0


def test_a_batch_handler_that_raises_a_bug_stops_at_its_event_with_the_events_before_it_committed(rig):
    orders = [Order(f"o-{i:03d}", key="k") for i in range(150)]
    bug = Order("bug-1", key="k")
    stream = orders[:100] + [bug] + orders[100:]
    rig.produce(stream)
    service = rig.start(FAULTS, "--batch")
    assert service.wait(60) == 1, "a handler's bug stops the consumer"
    assert rig.committed() == stream.index(bug), "everything before the failing event was committed"
    assert rig.invoices_per_order() == {o.order_id: 1 for o in orders[:100]}
    assert "injected bug in the handler of bug-1" in service.log()


@pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch_handler"])
def test_guard_rows_written_while_a_batch_is_decoded_are_the_events_ids(rig, consume, batch):
    """The guard statement is sent with the records' id headers before the batch is decoded. An undecodable
    record in the batch rolls those guard rows back (it is dead-lettered, never marked processed); a
    deserializer whose event ids are not the headers' makes the consumer guard by the events' ids."""
    orders = [Order(f"o-{i:03d}", key="k") for i in range(300)]  # one key: one partition, in this order
    garbage = Order("o-garbage", key="k", value=b"\x00\x00not avro at all")
    rig.produce(orders[:200] + [garbage] + orders[200:])
    service = rig.start(FAULTS, *(["--batch"] if batch else []))
    rig.wait_committed(len(orders) + 1)
    assert rig.invoices_per_order() == {o.order_id: 1 for o in orders}
    assert sorted(rig.processed_ids()) == sorted(o.event_id for o in orders), "the dead letter was marked"
    assert [r.headers["id"].decode() for r in consume(rig.dlq, 1)] == [garbage.event_id]
    assert service.terminate(30) == 0

    more = [Order(f"p-{i:03d}", key="k") for i in range(300)]
    rig.produce(more)
    service = rig.start(FAULTS, *(["--batch"] if batch else []), FAULT_OWN_IDS="1")
    rig.wait_committed(len(orders) + 1 + len(more))
    assert sorted(rig.processed_ids()) == sorted(
        [o.event_id for o in orders] + [f"own-{o.event_id}" for o in more]
    )
    assert rig.invoices_per_order() == {o.order_id: 1 for o in [*orders, *more]}
    assert service.terminate(30) == 0


def test_values_the_registry_cannot_explain_go_to_the_dead_letter_topic(rig, consume, schema_registry_url):
    """Confluent-framed values that cannot be read: one shorter than its 5-byte header, one whose schema id
    is a JSON schema in the registry. Both are undecodable records: dead-lettered, and the partition goes on
    to the next event instead of the consumer stopping on them for good."""
    json_schema = '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}'
    with SchemaRegistryClient(registry_client_config(schema_registry_url)) as client:
        json_id = client.register_schema(f"{rig.topic}-json-value", Schema(json_schema, "JSON"))
    short = Order("o-short", key="k", value=b"\x00\x00\x07")
    not_avro = Order("o-json", key="k", value=confluent_header(json_id) + b'{"order_id": "o-json"}')
    after = Order("o-after", key="k")  # one partition: behind the two
    rig.produce([short, not_avro, after])
    service = rig.start("examples.invoice_service", "--schema-registry-url", schema_registry_url)
    rig.wait_committed(3)
    assert rig.invoices_per_order() == {"o-after": 1}
    letters = {r.headers["id"].decode(): r for r in consume(rig.dlq, 2)}
    assert set(letters) == {short.event_id, not_avro.event_id}
    for order in (short, not_avro):
        letter = letters[order.event_id]
        assert letter.headers["error_reason"] == b"undecodable" and letter.value == order.value
    assert b"shorter than the Confluent framing" in letters[short.event_id].headers["error_message"]
    assert b"a JSON schema, not Avro" in letters[not_avro.event_id].headers["error_message"]
    assert service.terminate(30) == 0


def test_a_dead_letter_too_large_for_its_topic_is_sent_reduced(rig, consume):
    """The dead-letter topic takes at most 4 KB a record; the undecodable record has a 20 KB header and a
    2 KB key. It is dead-lettered without its own headers (its id kept) and with its key cut, and the
    partition goes on; before, the broker's refusal stopped the consumer on it."""
    limit = ConfigEntry("max.message.bytes", "4096", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, rig.dlq, incremental_configs=[limit])
    settled(
        lambda left: rig.admin.incremental_alter_configs([resource])[resource].result(timeout=left),
        "alter configs",
    )
    bad, after = Order("o-bad", key="k" * 2000), Order("o-after")
    producer = Producer({**client_config(rig.bootstrap)})
    producer.produce(
        rig.topic,
        key=bad.key,
        value=b"not avro",
        headers=[("id", bad.event_id.encode()), ("blob", b"x" * 20_000)],
    )
    assert producer.flush(30) == 0
    rig.produce([after])
    service = rig.start("examples.invoice_service")
    rig.wait_committed(2)
    assert rig.invoices_per_order() == {"o-after": 1}
    (letter,) = consume(rig.dlq, 1)
    assert letter.headers["id"] == bad.event_id.encode() and "blob" not in letter.headers
    assert letter.headers["error_reason"] == b"undecodable" and letter.value == b"not avro"
    assert letter.key == b"k" * 256
    assert letter.headers["reduced"] == b"left out: the record's own headers but id, the key after 256 bytes"
    service.wait_for_log(r"is too large for \S+; sending it smaller")
    assert service.terminate(30) == 0
