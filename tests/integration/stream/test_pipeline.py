"""`cdc run` end to end, as a subprocess against the real PostgreSQL and Kafka (docs/design.md guarantees).

Every test polls with a timeout and asserts concrete values: ids, headers, LSNs, exit codes, counts.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import re
import signal
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import psycopg
import pytest
from fastavro import schemaless_reader
from psycopg.conninfo import conninfo_to_dict

from cdc.avro.encoder import MAGIC
from cdc.avro.store import SchemaStore
from cdc.errors import format_lsn, parse_lsn
from tests.plugins.pipeline import (
    SCHEMAS_DIR,
    cdc,
    free_port,
    order_placed,
    topic_partitions,
    topic_size,
    wait_until,
)
from tests.traces import continues

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def decode_value(store: SchemaStore, value: bytes) -> tuple[str, int, object]:
    """(event_type, version, payload) of a single-object encoded record value."""
    assert value[:2] == MAGIC, f"not single-object encoding: {value[:2].hex()}"
    event_type, version = store.by_fingerprint(value[2:10])
    payload = schemaless_reader(io.BytesIO(value[10:]), store.get(event_type, version).parsed)
    return event_type, version, payload


def as_decoded(event_type: str, payload: dict) -> dict:
    """What fastavro reads back for `payload`: logical types come back as Python objects."""
    if event_type == "OrderShipped":
        return {**payload, "shipped_at": datetime.fromtimestamp(payload["shipped_at"] / 1000, tz=UTC)}
    return payload


def ids_of(records) -> list[str]:
    return [r.headers["id"].decode() for r in records]


def wait_topic_size(bootstrap: str, topic: str, n: int, timeout: float) -> int:
    return wait_until(
        lambda: (size := topic_size(bootstrap, topic)) >= n and size,
        timeout,
        f"{n} records in {topic}",
        interval=0.5,
    )


# -- guarantee 1 and the record format -----------------------------------------------------------------------


@pytest.mark.core
def test_committed_events_arrive_with_their_record_format_rolled_back_never(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    proc = pipeline_process()
    proc.wait_streaming()
    tag = uuid.uuid4().hex[:6]
    a, b, c = f"order-A-{tag}", f"order-B-{tag}", f"cust-C-{tag}"
    now_ms = int(time.time() * 1000)

    def shipped(order_id: str) -> dict:
        return {"order_id": order_id, "carrier": "DHL", "shipped_at": now_ms}

    def customer(cid: str) -> dict:
        return {"customer_id": cid, "email": f"{cid}@example.com", "marketing_opt_in": True}

    ev = outbox.event
    t1 = outbox.commit(
        [
            ev(a, headers={"traceparent": TRACEPARENT, "tenant": 7, "dropped": None}),
            ev(b, {**order_placed("o-b1"), "coupon": "WELCOME"}, schema_version=2),
            ev(a, shipped("o-a1"), event_type="OrderShipped"),
            ev(c, customer(c), event_type="CustomerRegistered", aggregate_type="customer"),
        ]
    )
    r1 = outbox.rollback(
        [ev(a), ev(b), ev(c, customer(c), event_type="CustomerRegistered", aggregate_type="customer")]
    )
    t2 = outbox.commit(
        [ev(b, shipped("o-b1"), event_type="OrderShipped"), ev(a), ev(b, headers={"x-retry": "2"})]
    )
    r2 = outbox.rollback([ev(a, shipped("o-a9"), event_type="OrderShipped")])
    t3 = outbox.commit(
        [
            ev(a, {**order_placed("o-a3"), "coupon": None}, schema_version=2),
            ev(c, customer(c + "-2"), event_type="CustomerRegistered", aggregate_type="customer"),
            ev(b),
            ev(a, shipped("o-a3"), event_type="OrderShipped"),
        ]
    )
    committed = [e for t in (t1, t2, t3) for e in t.events]
    rolled_back = {e.id for t in (r1, r2) for e in t.events}
    txn_of = {e.id: t for t in (t1, t2, t3) for e in t.events}
    by_id = {e.id: e for e in committed}
    order_topic, customer_topic = outbox.topic("order"), outbox.topic("customer")
    expected = {
        order_topic: [e.id for e in committed if e.aggregate_type == "order"],
        customer_topic: [e.id for e in committed if e.aggregate_type == "customer"],
    }

    store = SchemaStore(SCHEMAS_DIR)
    for topic, want in expected.items():
        records = consume(topic, len(want), timeout=60)
        assert sorted(ids_of(records)) == sorted(want), f"{topic}: wrong set of events"
        # Everything up to t3 was streamed: nothing else is in the topic, in particular no rolled-back event.
        assert topic_size(kafka_bootstrap, topic) == len(want)
        assert not rolled_back & set(ids_of(records))
        assert topic_partitions(kafka_bootstrap, topic) == 3

        for record in records:
            event = by_id[record.headers["id"].decode()]
            txn = txn_of[event.id]
            assert record.key == event.aggregate_id.encode()
            h = record.headers
            assert h["event_type"] == event.event_type.encode()
            assert h["schema_version"] == str(event.schema_version).encode()
            assert h["aggregate_type"] == event.aggregate_type.encode()
            assert h["xid"] == str(txn.xid).encode()
            commit_lsn = parse_lsn(h["commit_lsn"].decode())
            assert txn.lsn_before < commit_lsn < txn.lsn_after, (
                f"commit_lsn {h['commit_lsn']!r} outside its transaction "
                f"({format_lsn(txn.lsn_before)}..{format_lsn(txn.lsn_after)})"
            )
            row_headers = {k: v for k, v in (event.headers or {}).items() if v is not None}
            expected_headers = {
                "id",
                "event_type",
                "schema_version",
                "aggregate_type",
                "commit_lsn",
                "xid",
                *row_headers,
            }
            assert set(h) == expected_headers
            for key, value in row_headers.items():
                if key == "traceparent":
                    assert continues(h[key], value), h[key]
                    continue
                assert h[key] == (value if isinstance(value, str) else str(value)).encode()
            event_type, version, payload = decode_value(store, record.value)
            assert (event_type, version) == (event.event_type, event.schema_version)
            want_payload = dict(event.payload)
            if version == 2:
                want_payload.setdefault("coupon", None)
            assert payload == as_decoded(event.event_type, want_payload)
            created_ms = txn.created_at.timestamp() * 1000
            assert abs(record.timestamp_ms - created_ms) < 1000, (
                f"record timestamp {record.timestamp_ms} is not the commit time (created_at {created_ms:.0f})"
            )

        # Per aggregate: one partition, commit order (offset order = insertion order across transactions).
        keys = defaultdict(list)
        for record in sorted(records, key=lambda r: (r.partition, r.offset)):
            keys[record.key].append(record)
        for key, recs in keys.items():
            assert len({r.partition for r in recs}) == 1, f"aggregate {key!r} spread over partitions"
            assert ids_of(recs) == [i for i in want if by_id[i].aggregate_id.encode() == key]

    # One commit_lsn per transaction, rising in commit order.
    all_records = consume(order_topic, len(expected[order_topic]), timeout=30)
    lsn_of = {
        txn_of[i].xid: r.headers["commit_lsn"] for i, r in zip(ids_of(all_records), all_records, strict=True)
    }
    lsns = [parse_lsn(lsn_of[t.xid].decode()) for t in (t1, t2, t3)]
    assert lsns == sorted(lsns) and len(set(lsns)) == 3
    assert proc.alive()


# -- a large transaction, memory bounded ---------------------------------------------------------------------


@pytest.mark.core
def test_a_200k_row_transaction_arrives_whole_with_bounded_memory(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    proc = pipeline_process()
    proc.wait_streaming()
    [txn] = outbox.bulk(200_000, aggregates=1000)
    topic = outbox.topic("order")
    started = time.monotonic()
    size = wait_topic_size(kafka_bootstrap, topic, 200_000, timeout=180)
    elapsed = time.monotonic() - started
    peak_kb = proc.status("VmHWM")
    print(f"\n200k-row transaction: {elapsed:.1f} s to arrive, pipeline peak RSS {peak_kb / 1024:.0f} MB")

    records = consume(topic, size, timeout=120)
    ids = set(ids_of(records))
    assert len(records) == size == 200_000, f"{size} records for 200 000 events: duplicates"
    assert len(ids) == 200_000
    assert ids == outbox.ids()
    assert {r.headers["xid"] for r in records} == {str(txn.xid).encode()}
    assert peak_kb < 400 * 1024, f"pipeline peak RSS {peak_kb / 1024:.0f} MB for a 200k-row transaction"
    # The whole transaction was acknowledged, so the slot moves past it.
    commit_lsn = parse_lsn(records[0].headers["commit_lsn"].decode())
    wait_until(lambda: outbox.confirmed_lsn() > commit_lsn, 30, "the slot to confirm the transaction")


# -- guarantee 2: the broker goes away -----------------------------------------------------------------------


def test_broker_outage_holds_the_confirmed_lsn_back_then_everything_arrives(
    outbox, private_kafka, pipeline_process
):
    proc = pipeline_process(CDC_KAFKA_BOOTSTRAP_SERVERS=private_kafka.bootstrap, CDC_DELIVERY_TIMEOUT="300")
    proc.wait_streaming()
    topic = outbox.topic("order")
    before = [outbox.commit([outbox.event(f"agg-{i % 3}") for i in range(5)]) for _ in range(4)]
    records = private_kafka.consume(topic, 20, timeout=60)
    assert len(records) == 20
    last_before = max(parse_lsn(r.headers["commit_lsn"].decode()) for r in records)
    wait_until(lambda: outbox.confirmed_lsn() > last_before, 30, "the acknowledged events to be confirmed")

    private_kafka.stop()
    during = [outbox.commit([outbox.event(f"agg-{i % 3}") for i in range(5)]) for _ in range(3)]
    # The pipeline has read the transactions written during the outage (it reports them as written).
    wait_until(lambda: outbox.received_lsn() > during[-1].lsn_before, 30, "the pipeline to read them")
    samples = []
    deadline = time.monotonic() + 3  # three status intervals
    while time.monotonic() < deadline:
        samples.append(outbox.confirmed_lsn())
        time.sleep(0.2)
    assert proc.alive(), "the pipeline gave up while Kafka was down"
    assert max(samples) < during[0].lsn_after, (
        f"the slot confirmed {format_lsn(max(samples))} while the events of the transaction committed at "
        f"or before {format_lsn(during[0].lsn_after)} were not acknowledged"
    )

    private_kafka.start()
    expected = {e.id for t in before + during for e in t.events}
    wait_until(lambda: private_kafka.topic_size(topic) >= len(expected), 120, "the events after the outage")
    records = private_kafka.consume(topic, private_kafka.topic_size(topic), timeout=60)
    missing = expected - set(ids_of(records))
    assert not missing, f"{len(missing)} events missing after the outage"
    outage_commits = {
        parse_lsn(r.headers["commit_lsn"].decode())
        for r in records
        if r.headers["id"].decode() in {e.id for t in during for e in t.events}
    }
    assert len(outage_commits) == 3
    # Exact: the slot never passed the first transaction that was not acknowledged (pgoutput skips a
    # transaction whose commit record starts before confirmed_flush_lsn).
    assert max(samples) <= min(outage_commits)
    wait_until(
        lambda: outbox.confirmed_lsn() > max(outage_commits), 30, "the confirmed LSN to move past the outage"
    )
    assert proc.alive()


# -- at-least-once across kill -9 ----------------------------------------------------------------------------


@pytest.mark.core
def test_kill_9_mid_stream_loses_nothing_and_duplicates_at_most_the_in_flight_window(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    max_in_flight, per_txn, total = 5000, 100, 100_000
    txns = outbox.bulk(total, per_transaction=per_txn, aggregates=200)
    topic = outbox.topic("order")
    proc = pipeline_process(CDC_MAX_IN_FLIGHT=str(max_in_flight))
    # Kill once the slot has confirmed a tenth of the transactions.
    wait_until(lambda: outbox.confirmed_lsn() > txns[100].lsn_before, 60, "100 transactions confirmed", 0.02)
    assert proc.kill() == -9
    confirmed_at_kill = outbox.confirmed_lsn()
    assert confirmed_at_kill < txns[-1].lsn_before, (
        "the pipeline was done before the kill: nothing was tested"
    )
    published_at_kill = topic_size(kafka_bootstrap, topic)

    proc2 = pipeline_process(CDC_MAX_IN_FLIGHT=str(max_in_flight))
    proc2.wait_streaming()
    wait_until(lambda: outbox.confirmed_lsn() > txns[-1].lsn_before, 120, "all transactions confirmed")
    size = topic_size(kafka_bootstrap, topic)
    records = consume(topic, size, timeout=120)
    assert len(records) == size
    got = ids_of(records)
    order = outbox.bulk_numbers()
    missing = set(order) - set(got)
    duplicates = len(got) - len(set(got))
    print(
        f"\nkill -9 after {published_at_kill} of {total} records published "
        f"(confirmed {format_lsn(confirmed_at_kill)}): {duplicates} duplicates after the restart"
    )
    assert len(order) == total
    assert not missing, f"{len(missing)} events lost across kill -9"
    # What comes again is what was published after the slot's confirmed position, never a transaction the
    # slot had confirmed. How much that is: up to max_in_flight unacknowledged, plus what was acknowledged
    # since the last status update (sent at most every STATUS_MIN_INTERVAL): about the window on a quiet
    # machine, twice it seen on a busy one (PostgreSQL 16 in a matrix run, 9,835 for a window of 5,000).
    counts: dict[str, int] = defaultdict(int)
    for event_id in got:
        counts[event_id] += 1
    repeated = sorted(order[i] for i, n in counts.items() if n > 1)
    confirmed_again = [
        t
        for t in txns
        if t.lsn_after <= confirmed_at_kill
        and bisect.bisect_left(repeated, t.first) < bisect.bisect_left(repeated, t.first + t.count)
    ]
    assert not confirmed_again, f"{len(confirmed_again)} transactions confirmed before the kill came again"
    assert duplicates <= 3 * max_in_flight, "far more than the window came again"
    # Guarantee 3 across the restart: per aggregate, first copies come in commit order.
    first_seen: dict[bytes, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        event_id = record.headers["id"].decode()
        if event_id not in seen:
            seen.add(event_id)
            first_seen[record.key].append(order[event_id])
    assert len(first_seen) == 200
    for key, sequence in first_seen.items():
        assert sequence == sorted(sequence), f"aggregate {key!r} out of commit order across the restart"


# -- guarantee 5: an idle outbox does not pin WAL ------------------------------------------------------------


@pytest.mark.core
def test_idle_outbox_slot_advances_while_another_database_writes_wal(
    outbox, pipeline_process, pg_connect, unique_name
):
    proc = pipeline_process(CDC_STATUS_INTERVAL="1")
    proc.wait_streaming()
    confirmed0, restart0 = outbox.slot_lsns()
    other = unique_name("noise")[:63]
    with pg_connect(autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(other)))
    try:
        with pg_connect(dbname=other, autocommit=True) as conn:
            conn.execute("CREATE TABLE noise (i int, pad text)")
            for _ in range(20):
                conn.execute("INSERT INTO noise SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g")
            conn.execute("CHECKPOINT")  # logs the running transactions: restart_lsn can move past them
            conn.execute("INSERT INTO noise VALUES (0, 'after the checkpoint')")
            target = outbox.current_lsn()
            assert target - confirmed0 > 4_000_000, "the other database did not write enough WAL"

            def advanced():
                confirmed, restart = outbox.slot_lsns()
                return confirmed >= target and restart > restart0 and (confirmed, restart)

            confirmed, restart = wait_until(advanced, 60, "the idle slot to follow the WAL", 0.5)
        assert proc.alive()
        assert confirmed >= target > confirmed0
        assert restart > restart0
    finally:
        with pg_connect(autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(other)
                )
            )


# -- guarantee 4: a bad event goes to the dead-letter topic --------------------------------------------------


@pytest.mark.core
def test_invalid_payload_goes_to_the_dead_letter_topic_and_the_stream_goes_on(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    proc = pipeline_process()
    proc.wait_streaming()
    secret = f"SECRET-{uuid.uuid4().hex}"
    good1 = outbox.event("agg-1")
    bad = outbox.event(
        "agg-1", order_placed("o-bad", amount_cents=secret), headers={"traceparent": TRACEPARENT}
    )
    good2 = outbox.event("agg-1")
    t1 = outbox.commit([good1, bad, good2])
    topic = outbox.topic("order")

    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert len(dead) == 1
    records = consume(topic, 2, timeout=60)
    assert ids_of(records) == [good1.id, good2.id]

    good3 = outbox.event("agg-1")
    outbox.commit([good3])
    records = consume(topic, 3, timeout=60)
    assert ids_of(records) == [good1.id, good2.id, good3.id]
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 1
    assert topic_size(kafka_bootstrap, topic) == 3

    [record] = dead
    h = record.headers
    assert h["id"] == bad.id.encode()
    assert h["error_class"] == b"PayloadInvalidError"
    assert h["error_reason"] == b"payload_invalid"
    assert b"amount_cents" in h["error_message"], h["error_message"]
    assert h["original_topic"] == topic.encode()
    assert h["commit_lsn"] == records[0].headers["commit_lsn"]
    assert h["xid"] == str(t1.xid).encode()
    assert h["event_type"] == b"OrderPlaced"
    assert h["schema_version"] == b"1"
    assert h["aggregate_type"] == b"order"
    assert continues(h["traceparent"], TRACEPARENT), h["traceparent"]
    assert record.key == b"agg-1"
    assert json.loads(record.value) == bad.payload
    # Guarantee 8: the payload's value is in the dead letter, but never in an error or a log line.
    for value in h.values():
        assert secret.encode() not in value
    assert secret not in proc.log()
    assert proc.alive()


# -- guarantee 7: SIGTERM ------------------------------------------------------------------------------------


def walsender_wait_event(outbox, pid: int) -> str | None:
    row = outbox.conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else row[0]


def pause_walsender_while_sending(outbox, pipeline_pid: int, timeout: float = 20) -> int:
    """SIGSTOP the slot's walsender at a moment it waits for the pipeline to take more data (wait event
    WalSenderWriteData); returns its pid. The caller must SIGCONT it. The pipeline is paused meanwhile, so
    that the walsender fills the socket and waits, however fast the pipeline reads on this machine today."""
    pid = outbox.slot_active_pid()
    assert pid is not None, "no walsender"
    os.kill(pipeline_pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if walsender_wait_event(outbox, pid) == "WalSenderWriteData":
                os.kill(pid, signal.SIGSTOP)
                try:
                    # A stopped process keeps the wait event it had: it tells where it was stopped.
                    if walsender_wait_event(outbox, pid) == "WalSenderWriteData":
                        return pid
                except BaseException:
                    os.kill(pid, signal.SIGCONT)
                    raise
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)
    finally:
        os.kill(pipeline_pid, signal.SIGCONT)
    raise AssertionError("the walsender was never caught waiting to send (has the pipeline read everything?)")


def sigterm_mid_stream(outbox, pipeline_process, consume, kafka_bootstrap, sizes, *, slow_walsender=False):
    """Write events in transactions (`sizes`: (events, per transaction) pairs), start the pipeline, SIGTERM
    it once 40 transactions are confirmed, and read what arrived.

    `slow_walsender`: the walsender is paused (SIGSTOP) while it waits to send more to the pipeline, from
    just before the SIGTERM until the pipeline has exited, or for 5 s at most: a walsender that is slow to
    get the CPU, as on a busy server. It makes the timing of the pipeline's exit deterministic."""
    txns = []
    for count, per_txn in sizes:
        txns += outbox.bulk(count, per_transaction=per_txn, aggregates=100, first=sum(t.count for t in txns))
    topic = outbox.topic("order")
    firsts = [t.first for t in txns]
    txn_index = {
        event_id: bisect.bisect_right(firsts, i) - 1 for event_id, i in outbox.bulk_numbers().items()
    }
    assert len(txn_index) == sum(t.count for t in txns)

    proc = pipeline_process()
    wait_until(lambda: outbox.confirmed_lsn() > txns[40].lsn_before, 60, "40 transactions confirmed", 0.02)
    walsender = pause_walsender_while_sending(outbox, proc.pid) if slow_walsender else None
    try:
        proc.proc.send_signal(signal.SIGTERM)
        if walsender is not None:
            deadline = time.monotonic() + 5
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        if walsender is not None:
            os.kill(walsender, signal.SIGCONT)
    code = proc.terminate()
    assert code == 0, proc.tail()
    assert "received SIGTERM" in proc.log() and "stopped:" in proc.log()
    # The walsender may still be reading the pipeline's last messages: read the slot once it is released.
    wait_until(lambda: outbox.slot_active_pid() is None, 30, "the walsender to release the slot")
    confirmed = outbox.confirmed_lsn()
    assert confirmed < txns[-1].lsn_before, "the pipeline was done before SIGTERM: nothing was tested"

    size = topic_size(kafka_bootstrap, topic)
    records = consume(topic, size, timeout=60)
    assert len(records) == size
    arrived: dict[int, set[str]] = defaultdict(set)
    commit_lsn: dict[int, int] = {}
    for record in records:
        event_id = record.headers["id"].decode()
        arrived[txn_index[event_id]].add(event_id)
        commit_lsn[txn_index[event_id]] = parse_lsn(record.headers["commit_lsn"].decode())
    assert len(records) == sum(map(len, arrived.values())), "duplicates without a restart"
    complete = 0  # transactions 0..complete-1 arrived whole
    while len(arrived.get(complete, ())) == txns[complete].count:
        complete += 1
    assert complete >= 40
    # Only the transaction being read at SIGTERM may be partial; nothing after it was read.
    assert set(arrived) <= {*range(complete), complete}
    return txns, txn_index, confirmed, complete, arrived, commit_lsn, proc


def test_sigterm_mid_stream_exits_0_never_confirms_too_far_and_a_restart_delivers_the_rest(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    txns, txn_index, confirmed, complete, arrived, commit_lsn, _ = sigterm_mid_stream(
        outbox, pipeline_process, consume, kafka_bootstrap, [(120_000, 100)]
    )
    topic = outbox.topic("order")
    # Never past what arrived: not beyond the first transaction that did not arrive whole.
    first_incomplete = commit_lsn.get(complete, txns[complete].lsn_before)
    assert confirmed <= first_incomplete, (
        f"confirmed {format_lsn(confirmed)} passes transaction {complete}, which did not arrive whole"
    )
    published_at_stop = sum(map(len, arrived.values()))

    # A restart publishes the rest; duplicates only of what was published before the stop.
    proc2 = pipeline_process()
    proc2.wait_streaming()
    wait_until(lambda: outbox.confirmed_lsn() > txns[-1].lsn_before, 120, "all transactions confirmed")
    size = topic_size(kafka_bootstrap, topic)
    records = consume(topic, size, timeout=60)
    assert len(records) == size
    got = ids_of(records)
    assert set(got) == set(txn_index), f"{len(set(txn_index) - set(got))} events missing after the restart"
    duplicates = len(got) - len(set(got))
    print(
        f"\nSIGTERM after {complete} complete transactions ({published_at_stop} events); "
        f"{duplicates} duplicates after the restart"
    )
    assert duplicates <= published_at_stop

    # SIGTERM when idle: exit 0, and the slot is past the last transaction (a restart publishes nothing).
    assert proc2.terminate() == 0, proc2.tail()
    wait_until(lambda: outbox.slot_active_pid() is None, 30, "the walsender to release the slot")
    last_commit = max(parse_lsn(r.headers["commit_lsn"].decode()) for r in records)
    assert outbox.confirmed_lsn() > last_commit


@pytest.mark.core
def test_sigterm_mid_stream_confirms_exactly_the_last_transaction_that_arrived(
    outbox, pipeline_process, consume, kafka_bootstrap
):
    # More than the socket buffers hold after the stop: the walsender still has data to send at the exit. The
    # sizes of both tests scale with the pipeline's speed: 40 transactions are confirmed (what the SIGTERM
    # waits for) while it reads on, so the rest must outlast that lag (at 150,000 events/s, 30,000 did not).
    txns, _, confirmed, complete, _, commit_lsn, proc = sigterm_mid_stream(
        outbox,
        pipeline_process,
        consume,
        kafka_bootstrap,
        [(10_000, 100), (160_000, 1000)],
        slow_walsender=True,
    )
    last = complete - 1
    logged = re.search(r"stopped: .* confirmed LSN (\S+)", proc.log())
    assert logged, proc.tail()

    def boundary(lsn: int) -> int | None:
        """The transaction whose commit record ends at ``lsn``: past its commit LSN, not past its end."""
        return next((k for k in (last, last - 1) if commit_lsn[k] < lsn <= txns[k].lsn_after), None)

    # The pipeline knows the right position: the end of the commit record of the last transaction that
    # arrived whole, or of the one before when the stop came between its last insert and its Commit message
    # (all its events are in Kafka, but a transaction is confirmed only once its Commit was read).
    assert boundary(parse_lsn(logged.group(1))) is not None, (
        f"the pipeline logged {logged.group(1)}; the last complete transaction commits at "
        f"{format_lsn(commit_lsn[last])}"
    )
    # ...and the slot must have it: past that commit record, not into the next transaction.
    assert boundary(confirmed) is not None, (
        f"slot confirmed {format_lsn(confirmed)}; the pipeline logged {logged.group(1)}, the last complete "
        f"transaction commits at {format_lsn(commit_lsn[last])}"
    )
    assert confirmed <= txns[complete].lsn_before


# -- refusals ------------------------------------------------------------------------------------------------


def run_refused(
    env: dict[str, str], timeout: float = 60, command: str = "run", args: list[str] | None = None
) -> tuple[int, str, float]:
    """`cdc <command> [args]` as a subprocess: (exit code, stderr, seconds)."""
    started = time.monotonic()
    done = cdc(env, command, *(args or []), timeout=timeout)
    return done.returncode, done.stderr, time.monotonic() - started


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("cdc: error:")]
    assert len(lines) == 1, f"expected one 'cdc: error:' line on stderr:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("missing", ["slot", "publication", "broker"])
@pytest.mark.core
def test_refuses_to_start_with_one_line_exit_2_unless_a_restart_helps(outbox, missing):
    """A missing slot or publication exits 2 (a restart cannot help); a broker that does not answer is an
    outage and exits 1, so that the supervisor's restart waits for it again (docs/design.md, "Exit
    codes")."""
    env = dict(outbox.env, CDC_STARTUP_TIMEOUT="3")
    name = f"missing_{uuid.uuid4().hex[:8]}"
    if missing == "slot":
        env["CDC_SLOT"] = name
        want = f"cdc: error: replication slot '{name}' does not exist"
    elif missing == "publication":
        env["CDC_PUBLICATION"] = name
        want = f"cdc: error: publication '{name}' does not exist"
    else:
        port = free_port()
        env["CDC_KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
        want = f"cdc: error: Kafka at 127.0.0.1:{port} did not answer within startup_timeout = 3 s"
    code, stderr, elapsed = run_refused(env)
    assert code == (1 if missing == "broker" else 2), stderr
    line = error_line(stderr)
    assert line.startswith(want), line
    assert elapsed < 30
    password = conninfo_to_dict(outbox.dsn).get("password")
    assert password, "the test DSN has no password: nothing would show a leak"
    assert password not in stderr
    # Never a silent re-creation (guarantee 6), and the real slot was left alone.
    row = outbox.conn.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (name,)
    ).fetchone()
    assert row == (0,)
    assert outbox.slot_active_pid() is None


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@pytest.mark.parametrize("missing", ["slot", "broker"])
def test_refusal_stderr_is_json_log_lines_and_the_error_line(outbox, missing):
    """With log_format = json, stderr holds JSON log lines and the one `cdc: error:` line, nothing else."""
    env = dict(outbox.env, CDC_STARTUP_TIMEOUT="3", CDC_LOG_FORMAT="json")
    if missing == "slot":
        env["CDC_SLOT"] = f"missing_{uuid.uuid4().hex[:8]}"
    else:
        env["CDC_KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{free_port()}"
    code, stderr, _ = run_refused(env)
    assert code == (1 if missing == "broker" else 2), stderr
    error_line(stderr)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("cdc: error:")]
    assert lines, "no log line at all"
    stray = [line for line in lines if not is_json_object(line)]
    assert not stray, f"{len(stray)} of {len(lines)} stderr lines are not JSON log lines, e.g. {stray[0]!r}"
