"""The exactly-once checkpoint belongs to one WAL history (issue 30, item 1).

An LSN names a transaction only within one server's history. A checkpoint written by another PostgreSQL
system under the same database and slot names, or on the timeline a promoted standby left behind, must
never make `cdc run` skip (and confirm past) the transactions of this server: every committed event arrives
once, for a read_committed reader."""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
import pytest

from cdc.ops import setup as cdc_setup
from cdc.stream.checkpoint_topic import read_checkpoint
from cdc.stream.preflight import slot_identity
from tests.integration.stream.test_exactly_once import ids, read_all
from tests.plugins.pgcluster import extra_cluster, standby_pair
from tests.plugins.pipeline import Outbox, cdc, wait_until
from tests.plugins.postgres import dsn_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def elsewhere(outbox: Outbox, dsn: str) -> Outbox:
    """The same outbox (table, publication, slot, topics: every name) on another server, set up there."""
    settings = dataclasses.replace(outbox.settings, database_url=dsn)
    cdc_setup.apply(settings)
    return dataclasses.replace(
        outbox,
        settings=settings,
        env={**outbox.env, "CDC_DATABASE_URL": dsn},
        dsn=dsn,
        conn=psycopg.connect(dsn, autocommit=True),
        transactions=[],
    )


@pytest.fixture
def eo(outbox: Outbox, unique_name) -> dict[str, str]:
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    return {"CDC_DELIVERY": "exactly-once", "CDC_CHECKPOINT_TOPIC": checkpoints}


def test_two_servers_with_the_same_names_share_a_checkpoint_topic_and_neither_skips_the_other(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    """Service B (the stack's cluster, far into its WAL) publishes first; service A, a young cluster with
    the same database, slot and table names, then starts on the same checkpoint topic. Its transactions
    sit below B's checkpoint in LSN: keyed by names, A skipped all of them and confirmed past them."""
    b = pipeline_process(**eo, CDC_TRANSACTIONAL_ID=f"outbox-cdc.b-{uuid.uuid4().hex}")
    b.wait_for_log(r"exactly-once: transactional id")
    for n in range(5):
        outbox.commit([outbox.event(f"b-{n}-{i}") for i in range(4)])
    wait_until(lambda: outbox.confirmed_lsn() >= outbox.transactions[-1].lsn_after, 30, "B's slot confirmed")
    assert b.terminate() == 0

    dbname = outbox.conn.info.dbname
    with extra_cluster(wal_level="logical") as other:
        with psycopg.connect(other, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname)))
        service_a = elsewhere(outbox, dsn_for(other, dbname=dbname))
        try:
            for n in range(5):
                service_a.commit([service_a.event(f"a-{n}-{i}") for i in range(4)])
            last = service_a.transactions[-1]
            assert last.lsn_after < outbox.transactions[0].lsn_before, "A's WAL must be younger than B's"
            a = pipeline_process(
                **eo, CDC_DATABASE_URL=service_a.dsn, CDC_TRANSACTIONAL_ID=f"outbox-cdc.a-{uuid.uuid4().hex}"
            )
            a.wait_for_log(r"exactly-once: transactional id")
            wait_until(lambda: service_a.confirmed_lsn() >= last.lsn_after, 30, "A's slot confirmed")
            seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
            expected = outbox.ids() | service_a.ids()
            assert not expected - set(seen), f"{len(expected - set(seen))} of A's events missing"
            assert max(seen.values()) == 1, seen.most_common(3)
            assert a.terminate() == 0
            assert "0 source transactions skipped" in a.log(), a.tail()
        finally:
            service_a.conn.close()


def test_a_standby_promoted_while_behind_publishes_its_own_transactions_past_the_old_checkpoint(
    outbox: Outbox, pipeline_process, eo, kafka_bootstrap
):
    """The pipeline on the primary publishes a batch the standby never received; the standby is promoted.
    Its new timeline reuses those LSNs for other transactions: only what commits below the switch point is
    the checkpoint's to skip."""

    def prepare(dsn: str) -> None:  # the outbox, publication, slot and saved identity go into the copy
        cdc_setup.apply(dataclasses.replace(outbox.settings, database_url=dsn))

    with standby_pair(failover_slots=False, before_copy=prepare) as pair:
        primary = elsewhere(outbox, pair.dsn(pair.primary))
        try:
            p1 = pipeline_process(**eo, CDC_DATABASE_URL=primary.dsn)
            p1.wait_for_log(r"exactly-once: transactional id")
            # What the standby receives: a batch the checkpoint covers, on both histories.
            primary.bulk(200, per_transaction=20)
            wait_until(lambda: primary.confirmed_lsn() >= primary.transactions[-1].lsn_after, 30, "batch 1")
            with psycopg.connect(pair.dsn(pair.standby), autocommit=True) as standby:
                target = primary.current_lsn()
                wait_until(lambda: _replayed(standby) >= target, 30, "the standby to replay the first batch")
            pair.standby.stop()
            # What it never receives: a long batch, published, and checkpointed far ahead.
            primary.bulk(3000, per_transaction=300, first=200)
            wait_until(lambda: primary.confirmed_lsn() >= primary.transactions[-1].lsn_after, 60, "batch 2")
            assert p1.terminate() == 0
            checkpoint_lsn = primary.transactions[-1].lsn_after
        finally:
            primary.conn.close()
        pair.primary.stop()
        started = pair.standby.start(pair.standby.port)
        assert started.returncode == 0, started.stderr
        pair.promote_standby()

        promoted = dataclasses.replace(
            outbox,
            env={**outbox.env, "CDC_DATABASE_URL": pair.dsn(pair.standby)},
            dsn=pair.dsn(pair.standby),
            conn=psycopg.connect(pair.dsn(pair.standby), autocommit=True),
            transactions=[],
        )
        try:
            # Its own transactions, at LSNs the old timeline's checkpoint is past.
            for n in range(5):
                promoted.commit([promoted.event(f"p-{n}-{i}") for i in range(4)])
            assert promoted.transactions[-1].lsn_after < checkpoint_lsn, "the new timeline must reuse LSNs"
            p2 = pipeline_process(**eo, CDC_DATABASE_URL=promoted.dsn)
            p2.wait_for_log(r"exactly-once: transactional id")
            last = promoted.transactions[-1]
            wait_until(lambda: promoted.confirmed_lsn() >= last.lsn_after, 60, "the promoted slot confirmed")
            seen = ids(read_all(kafka_bootstrap, outbox.topic("order")))
            expected = promoted.ids()  # batch 1 and the promoted server's own; batch 2 died with the primary
            missing = expected - set(seen)
            assert not missing, f"{len(missing)} events of the promoted server missing"
            assert max(seen.values()) == 1, seen.most_common(3)
            assert p2.terminate() == 0
            assert "which this server left at" in p2.log(), p2.tail()
        finally:
            promoted.conn.close()


def _replayed(conn: psycopg.Connection) -> int:
    from cdc.errors import parse_lsn

    row = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
    return parse_lsn(row[0]) if row and row[0] else 0


def test_teardown_forgets_the_slots_checkpoint_with_a_tombstone(outbox: Outbox, pipeline_process, eo):
    proc = pipeline_process(**eo)
    proc.wait_for_log(r"exactly-once: transactional id")
    txn = outbox.commit([outbox.event("t-1")])
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the slot confirmed the event")
    assert proc.terminate() == 0
    settings = dataclasses.replace(
        outbox.settings, delivery="exactly-once", checkpoint_topic=eo["CDC_CHECKPOINT_TOPIC"]
    )
    key = slot_identity(settings).key
    assert read_checkpoint(settings, key, timeout=10) is not None

    done = cdc({**outbox.env, **eo}, "teardown", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"wrote a tombstone for checkpoint {key.decode()}" in done.stdout
    assert read_checkpoint(settings, key, timeout=10) is None, "a tombstone reads as no checkpoint"
