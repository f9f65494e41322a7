"""`cdc outbox republish` against the real stack: the rows it chooses are published as `cdc run` publishes
them (the same topic, key, value and headers, from the same code), plus a ``cdc_republished`` header; a row
that cannot be an event is dead-lettered with the same reason; a dry run counts and publishes nothing."""

from __future__ import annotations

import time

import pytest

from tests.plugins.pipeline import Outbox, cdc, topic_size

pytestmark = pytest.mark.integration


def by_id(records) -> dict:
    return {r.headers["id"].decode(): r for r in records}


def test_republished_records_are_the_pipelines_records_with_a_mark(outbox: Outbox, pipeline_process, consume):
    ev = outbox.event
    shipped = {"order_id": "o-s", "carrier": "DHL", "shipped_at": int(time.time() * 1000)}
    customer = {"customer_id": "c-1", "email": "c-1@example.com", "marketing_opt_in": True}
    first = outbox.commit(
        [
            ev("a-1", headers={"traceparent": "00-4bf9-01", "tenant": 7}),
            ev("a-1", shipped, event_type="OrderShipped"),
            ev("c-1", customer, event_type="CustomerRegistered", aggregate_type="customer"),
            ev("a-2", {"order_id": "bad"}),  # not an OrderPlaced: a dead letter
        ]
    )
    later = outbox.commit([ev("a-3")])
    proc = pipeline_process()
    proc.wait_streaming()
    orders, customers = outbox.topic("order"), outbox.topic("customer")
    originals = by_id(consume(orders, 3, timeout=60) + consume(customers, 1, timeout=60))
    dead = consume(outbox.dlq_topic, 1, timeout=60)
    assert len(originals) == 4 and len(dead) == 1
    assert proc.terminate() == 0

    dry = cdc(outbox.env, "outbox", "republish", "--aggregate-type", "order", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would republish 4 rows, created ")
    assert topic_size(outbox.env["CDC_KAFKA_BOOTSTRAP_SERVERS"], orders) == 3, "a dry run publishes nothing"

    done = cdc(outbox.env, "outbox", "republish", "--all")
    assert done.returncode == 0, done.stderr
    assert "republished 4 events and dead-lettered 1 of 5 rows" in done.stdout
    assert "acknowledged" in done.stderr, "a line of progress when stderr is no terminal"

    records = consume(orders, 6, timeout=60) + consume(customers, 2, timeout=60)
    copies = [r for r in records if "cdc_republished" in r.headers]
    assert len(copies) == 4
    for copy in copies:
        original = originals[copy.headers["id"].decode()]
        assert (copy.topic, copy.key, copy.value) == (original.topic, original.key, original.value)
        mark = copy.headers.pop("cdc_republished")
        assert mark.startswith(b"republish ")
        assert copy.headers.pop("commit_lsn") == b"", "the commit LSN is not in the table"
        original.headers.pop("commit_lsn")
        assert copy.headers == original.headers, "the same headers: id, types, xid, the row's own"
    # The Kafka timestamp is the row's created_at: its transaction's start, a little before its commit.
    for copy in copies:
        original = originals[copy.headers["id"].decode()]
        assert 0 <= original.timestamp_ms - copy.timestamp_ms < 5_000
    dead_again = consume(outbox.dlq_topic, 2, timeout=30)
    assert len(dead_again) == 2
    assert dead_again[1].headers["error_reason"] == dead[0].headers["error_reason"] == b"payload_invalid"
    assert dead_again[1].headers["cdc_republished"].startswith(b"republish ")
    assert first.ids[3] == dead_again[1].headers["id"].decode()
    assert later.ids  # committed after: part of --all


def test_the_timestamp_is_created_at_cut_to_the_millisecond_as_cdc_run_cuts_the_commit_time(
    outbox: Outbox, consume
):
    """`cdc run` stamps a record with the commit time floored to the millisecond; a republished copy's
    created_at must be floored too. Rounded (a bigint cast), a row written 0.9 ms into a millisecond got
    the next one, and its copy was stamped after its original's commit."""
    txn = outbox.commit([outbox.event("t-1")])
    with outbox.conn.transaction():
        outbox.conn.execute(
            f"UPDATE {outbox.table} SET created_at = '2026-03-01 12:00:00.000900+00' WHERE id = %s",
            (txn.ids[0],),
        )
    done = cdc(outbox.env, "outbox", "republish", "--id", txn.ids[0])
    assert done.returncode == 0, done.stderr
    (record,) = consume(outbox.topic("order"), 1, timeout=30)
    assert record.timestamp_ms == 1_772_366_400_000


def test_filters_choose_the_rows(outbox: Outbox, consume):
    ev = outbox.event
    customer = {"customer_id": "c", "email": "e", "marketing_opt_in": False}
    old = outbox.commit([ev("f-1"), ev("f-2")])
    time.sleep(0.2)
    new = outbox.commit(
        [ev("f-3"), ev("f-4", customer, event_type="CustomerRegistered", aggregate_type="customer")]
    )
    assert old.created_at is not None and new.created_at is not None
    between = (old.created_at + (new.created_at - old.created_at) / 2).isoformat()

    def run(*args: str) -> str:
        done = cdc(outbox.env, "outbox", "republish", "--dry-run", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run("--id", old.ids[0], "--id", new.ids[0]).startswith("would republish 2 rows")
    assert run("--event-type", "CustomerRegistered").startswith("would republish 1 rows")
    assert run("--since", between).startswith("would republish 2 rows")
    assert run("--until", between).startswith("would republish 2 rows")
    assert run("--since", "1h", "--aggregate-type", "order").startswith("would republish 3 rows")

    none = cdc(outbox.env, "outbox", "republish")
    assert none.returncode == 2 and "--all" in none.stderr
    bad = cdc(outbox.env, "outbox", "republish", "--since", "yesterday")
    assert bad.returncode == 2 and "is not a time" in bad.stderr

    done = cdc(outbox.env, "outbox", "republish", "--id", new.ids[1])
    assert done.returncode == 0, done.stderr
    records = consume(outbox.topic("customer"), 1, timeout=30)
    assert [r.headers["id"].decode() for r in records] == [new.ids[1]]
