"""Exactly-once delivery (`delivery = "exactly-once"`): Kafka transactions that hold the events and the
checkpoint together. A read_committed reader sees each event once: across a kill -9, with a checkpoint
ahead of the slot, and with a zombie pipeline fenced by its successor. A read_uncommitted reader sees the
aborted copies too: the tests show the difference."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from urllib.parse import quote

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from psycopg.conninfo import conninfo_to_dict

from cdc.errors import parse_lsn
from tests.plugins.kafka import client_config
from tests.plugins.pipeline import Outbox, cdc, wait_until

pytestmark = pytest.mark.integration


def read_all(bootstrap: str, topic: str, *, committed: bool = True, quiet: float = 3.0) -> list:
    """Every record of ``topic``, read until ``quiet`` seconds pass without one."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    records = []
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                if msg.error() is None:
                    records.append(msg)
                    last = time.monotonic()
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(msg.error().str())
    finally:
        consumer.close()
    return records


def ids(records) -> Counter:
    return Counter(dict(r.headers())["id"].decode() for r in records)


@pytest.fixture
def eo(outbox: Outbox, unique_name) -> dict[str, str]:
    """The environment of an exactly-once pipeline, with a checkpoint topic of the test's own."""
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    return {"CDC_DELIVERY": "exactly-once", "CDC_CHECKPOINT_TOPIC": checkpoints}


def expected_ids(outbox: Outbox) -> set[str]:
    return outbox.ids()


def test_events_and_their_checkpoint_commit_together_and_each_arrives_once(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    proc = pipeline_process(**eo)
    proc.wait_streaming()
    proc.wait_for_log(r"exactly-once: transactional id outbox-cdc\.")
    for n in range(20):
        outbox.commit([outbox.event(f"a-{i % 4}") for i in range(5)])
        if n == 10:
            outbox.rollback([outbox.event("never")])
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed past the last row")
    seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox) and max(seen.values()) == 1

    checkpoints = read_all(kafka_bootstrap, eo["CDC_CHECKPOINT_TOPIC"], quiet=1)
    assert checkpoints, "no checkpoint record"
    # Keyed by the server's system identifier and the slot's creation point, not by names a URL gives.
    system_id, timeline = outbox.conn.execute(
        "SELECT system_identifier::text, timeline_id FROM pg_control_system(), pg_control_checkpoint()"
    ).fetchone()
    (created,) = outbox.conn.execute(
        f"SELECT slot_created_lsn::text FROM cdc_checkpoint WHERE slot = '{outbox.slot}'"
    ).fetchone()
    assert checkpoints[-1].key().decode() == f"{system_id}/{outbox.slot}@{created}"
    value = orjson.loads(checkpoints[-1].value())
    assert value["slot"] == outbox.slot and value["commit_time_us"] > 0
    assert (value["system_id"], value["timeline"]) == (system_id, timeline)
    # The checkpoint covers the last transaction, and the slot was confirmed no further than it.
    assert parse_lsn(value["end_lsn"]) > last.lsn_before
    assert outbox.confirmed_lsn() >= parse_lsn(value["end_lsn"])
    assert proc.terminate() == 0
    assert "Kafka transactions committed" in proc.log()


def test_kill_9_under_load_publishes_nothing_twice_for_read_committed_readers(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    # Transactions of up to 2 s: a kill -9 lands on an open one, whose records the broker has.
    eo = {**eo, "CDC_TRANSACTION_MAX_SECONDS": "2"}
    proc = pipeline_process(**eo)
    proc.wait_for_log(r"exactly-once: transactional id")
    for n in range(30):
        outbox.bulk(400, per_transaction=40, first=n * 400)
        if n in (8, 18):
            time.sleep(1)  # produced, not yet committed
            proc.kill()
            proc = pipeline_process(**eo)
            proc.wait_for_log(r"exactly-once: transactional id")
    wait_until(
        lambda: outbox.confirmed_lsn() >= outbox.transactions[-1].lsn_after, 60, "the slot confirmed the end"
    )
    topic = outbox.topic("order")
    committed = Counter(r.value() for r in read_all(kafka_bootstrap, topic))
    uncommitted = Counter(r.value() for r in read_all(kafka_bootstrap, topic, committed=False))
    assert len(committed) == 30 * 400, f"{30 * 400 - len(committed)} events missing"
    assert max(committed.values()) == 1, f"{sum(committed.values()) - len(committed)} duplicates"
    assert sum(uncommitted.values()) > sum(committed.values()), "no aborted transaction to tell apart"
    print(
        f"read_committed: {sum(committed.values())} records; read_uncommitted: {sum(uncommitted.values())} "
        "(the aborted copies of the killed pipelines' open transactions)"
    )
    assert proc.terminate() == 0


def test_a_checkpoint_ahead_of_the_slot_is_not_published_twice(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    """As after a kill -9 between the Kafka commit and the slot's confirmation: the slot replays source
    transactions that a committed Kafka transaction holds already. Made here with a copy of the slot taken
    before the events, put back in its place after they were published."""
    outbox.conn.execute(
        "SELECT pg_copy_logical_replication_slot(%s, %s)", (outbox.slot, outbox.slot + "_old")
    )
    try:
        proc = pipeline_process(**eo)
        proc.wait_streaming()
        for _ in range(10):
            outbox.commit([outbox.event(f"c-{i % 3}") for i in range(10)])
        last = outbox.transactions[-1]
        wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed the events")
        assert proc.terminate() == 0
        outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (outbox.slot,))
        outbox.conn.execute(
            "SELECT pg_copy_logical_replication_slot(%s, %s)", (outbox.slot + "_old", outbox.slot)
        )
        assert outbox.confirmed_lsn() < last.lsn_before, "the slot is behind the checkpoint again"

        again = pipeline_process(**eo)
        again.wait_streaming()
        more = outbox.commit([outbox.event("c-after")])
        wait_until(lambda: outbox.confirmed_lsn() >= more.lsn_after, 30, "the slot confirmed the new event")
        seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
        assert set(seen) == expected_ids(outbox) and max(seen.values()) == 1, seen.most_common(3)
        assert again.terminate() == 0
        assert "10 source transactions skipped" in again.log()
    finally:
        outbox.conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (outbox.slot + "_old",),
        )


@pytest.mark.parametrize("url", ["same", "written otherwise"])
def test_a_zombie_pipeline_is_fenced_by_its_successor_and_nothing_is_published_twice(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap, url
):
    """The first pipeline freezes (SIGSTOP) with a Kafka transaction open and loses its slot; a second one
    takes the slot and the transactional id. Thawed, the first may publish nothing: it is fenced, exit 1.
    The successor's database_url may be written otherwise (a URI, the database from PGDATABASE): the id
    comes from the server's identity and the slot, not from that text (issue 30, item 8)."""
    # Its transactions stay open for a minute: it freezes holding one.
    zombie = pipeline_process(**eo, CDC_TRANSACTION_MAX_SECONDS="60")
    zombie.wait_streaming()
    first = outbox.commit([outbox.event(f"z-{i % 3}") for i in range(20)])
    wait_until(lambda: outbox.received_lsn() >= first.lsn_after, 30, "the zombie to read the events")
    time.sleep(1)  # and to produce them, into its open Kafka transaction
    assert not read_all(kafka_bootstrap, outbox.topic("order"), quiet=1), "nothing committed yet"
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        outbox.conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
            (outbox.slot,),
        )
        wait_until(lambda: outbox.slot_active_pid() is None, 10, "the zombie's walsender to go")
        successor_env = dict(eo)
        if url != "same":
            params = conninfo_to_dict(outbox.dsn)
            # No database in the URL: libpq takes it from PGDATABASE.
            successor_env["CDC_DATABASE_URL"] = (
                f"postgresql://{params['user']}:{quote(params['password'])}@{params['host']}:{params['port']}"
                "?application_name=successor"
            )
            successor_env["PGDATABASE"] = params["dbname"]
            assert successor_env["CDC_DATABASE_URL"] != outbox.dsn
        successor = pipeline_process(**successor_env)
        successor.wait_for_log(r"exactly-once: transactional id")  # it has fenced the zombie
        outbox.commit([outbox.event(f"z-{i % 3}") for i in range(20)])
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    assert zombie.wait(timeout=60) == 1
    assert "fenced" in zombie.log(), zombie.tail()
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed the end")
    seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox) and max(seen.values()) == 1, seen.most_common(3)
    assert successor.terminate() == 0


def test_status_shows_the_checkpoint_beside_the_slot(outbox: Outbox, pipeline_process, eo):
    proc = pipeline_process(**eo)
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("s-1")])
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the slot confirmed the event")
    assert proc.terminate() == 0
    report = json.loads(cdc({**outbox.env, **eo}, "status", "--json").stdout)
    assert report["delivery"] == "exactly-once"
    assert report["checkpoint_lsn"] is not None and report["checkpoint_commit_time"] is not None


def test_dead_letters_commit_with_their_events_and_a_kill_publishes_neither_twice(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    """A dead letter is in the same Kafka transaction as the events around it: read_committed sees it once,
    across a kill -9 that replays its source transaction."""
    eo = {**eo, "CDC_TRANSACTION_MAX_SECONDS": "2"}
    proc = pipeline_process(**eo)
    proc.wait_for_log(r"exactly-once: transactional id")
    bad = outbox.event("d-1", {"order_id": "o-bad", "amount_cents": "lots"})
    outbox.commit([outbox.event("d-1"), bad, outbox.event("d-1")])
    time.sleep(1)  # produced into the open Kafka transaction, not committed
    proc.kill()
    proc = pipeline_process(**eo)
    proc.wait_for_log(r"exactly-once: transactional id")
    last = outbox.commit([outbox.event("d-2")])
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed the end")
    dead = ids(read_all(kafka_bootstrap, outbox.dlq_topic))
    assert dead == Counter({bad.id: 1})
    seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox) - {bad.id} and max(seen.values()) == 1
    assert proc.terminate() == 0


def test_a_full_producer_queue_at_the_commit_waits_for_room_for_the_checkpoint(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    """A source transaction as large as max_in_flight fills the producer's queue just as its Commit makes
    the Kafka transaction due: the checkpoint record must wait for room like any event (a BufferError
    escaped before, exit 1, and the same again at every restart)."""
    proc = pipeline_process(
        **eo, CDC_MAX_IN_FLIGHT="100", CDC_TRANSACTION_MAX_EVENTS="100", CDC_KAFKA_LINGER_MS="200"
    )
    proc.wait_for_log(r"exactly-once: transactional id")
    for n in range(3):
        outbox.bulk(100, first=n * 100)
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed the transactions")
    seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
    assert set(seen) == outbox.ids() and max(seen.values()) == 1
    assert proc.terminate() == 0, proc.tail()
    assert "Traceback" not in proc.log()


END_TXN = 26  # the Kafka API key of EndTxn, the commit (or abort) of a transaction


def test_a_commit_kafka_completed_after_it_was_taken_for_failed_is_not_published_again(
    outbox: Outbox, pipeline_process, eo, proxied_kafka
):
    """The broker commits, but its answer comes after delivery_timeout: the pipeline takes the commit for
    failed, cannot abort it, and replaces the producer, whose init_transactions() lets the coordinator
    finish the commit. What is published again must follow the checkpoint that Kafka holds, not the one
    the pipeline had in memory: a read_committed reader saw the transaction twice before."""
    broker, proxy = proxied_kafka
    env = {**eo, "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "CDC_DELIVERY_TIMEOUT": "1"}
    proc = pipeline_process(**env)
    proc.wait_for_log(r"exactly-once: transactional id")
    first = outbox.commit([outbox.event(f"h-{i % 3}") for i in range(5)])
    wait_until(lambda: outbox.confirmed_lsn() >= first.lsn_after, 30, "the first transaction confirmed")

    proxy.hold_next(END_TXN, 4.0)
    outbox.commit([outbox.event(f"h-{i % 3}") for i in range(10)])
    assert proxy.held.wait(30), "no commit went through the proxy"
    proc.wait_for_log(r"restarting in .* from the checkpoint that Kafka holds", 30)
    last = outbox.commit([outbox.event(f"h-{i % 3}") for i in range(5)])
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed the last one")
    seen = ids(read_all(broker.bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox), "events missing"
    assert max(seen.values()) == 1, f"published twice: {seen.most_common(3)}"
    assert proc.terminate() == 0, proc.tail()


def test_a_commit_taken_for_failed_when_postgresql_is_lost_is_not_published_again(
    outbox: Outbox, pipeline_process, eo, proxied_kafka
):
    """PostgreSQL is lost with a Kafka transaction open: the pipeline commits it before reconnecting, Kafka
    answers after delivery_timeout, the commit is taken for failed, and a new producer lets the coordinator
    finish it. The abort was swallowed without reading the checkpoint back, so the next session skipped only
    below the old one and published the committed events again (issue 42, item 3)."""
    broker, proxy = proxied_kafka
    env = {
        **eo,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "CDC_DELIVERY_TIMEOUT": "1",
        "CDC_TRANSACTION_MAX_SECONDS": "60",  # the Kafka transaction stays open until the source goes
    }
    proc = pipeline_process(**env)
    proc.wait_for_log(r"exactly-once: transactional id")
    outbox.commit([outbox.event(f"r-{i % 3}") for i in range(10)])
    wait_until(lambda: outbox.received_lsn() >= outbox.transactions[-1].lsn_after, 30, "the events read")

    proxy.hold_next(END_TXN, 4.0)
    outbox.conn.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
        (outbox.slot,),
    )
    assert proxy.held.wait(30), "no commit went through the proxy"
    proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", 60)
    last = outbox.commit([outbox.event(f"r-{i % 3}") for i in range(5)])
    wait_until(lambda: outbox.received_lsn() >= last.lsn_after, 30, "the last one read")
    assert proc.terminate() == 0, proc.tail()  # commits the open Kafka transaction
    assert outbox.confirmed_lsn() >= last.lsn_after
    seen = ids(read_all(broker.bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox), "events missing"
    assert max(seen.values()) == 1, f"published twice: {seen.most_common(3)}"


def test_a_transaction_kafka_can_no_longer_commit_is_aborted_and_the_run_goes_on(
    outbox: Outbox, pipeline_process, eo, proxied_kafka
):
    """Kafka goes silent for longer than delivery_timeout under load: records time out inside the Kafka
    transaction, which librdkafka then holds in its abortable state (produce() says "Erroneous state").
    The pipeline exited 1 on it and left the restart to a supervisor; it aborts the transaction and starts
    again from the checkpoint Kafka holds, in the process (issue 42, item 8)."""
    broker, proxy = proxied_kafka
    env = {
        **eo,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "CDC_DELIVERY_TIMEOUT": "2",
        "CDC_TRANSACTION_MAX_SECONDS": "20",  # no commit while Kafka is silent: records time out in it
    }
    proc = pipeline_process(**env)
    proc.wait_for_log(r"exactly-once: transactional id")
    outbox.commit([outbox.event(f"a-{i % 5}") for i in range(20)])
    time.sleep(1)

    proxy.freeze(new_too=True)
    frozen_at = time.monotonic()
    while time.monotonic() - frozen_at < 5:
        outbox.commit([outbox.event(f"a-{i % 5}") for i in range(50)])
        time.sleep(0.05)
    proxy.thaw()
    proc.wait_for_log(r"restarting in .* from the checkpoint that Kafka holds", 60)
    last = outbox.commit([outbox.event(f"a-{i % 5}") for i in range(20)])
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 90, "the slot confirmed the last one")
    assert proc.alive(), proc.tail()
    seen = ids(read_all(broker.bootstrap, outbox.topic("order")))
    assert set(seen) == expected_ids(outbox), "events missing"
    assert max(seen.values()) == 1, f"published twice: {seen.most_common(3)}"
    assert proc.terminate() == 0, proc.tail()
