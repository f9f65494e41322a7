"""A database restored from a disk snapshot loses nothing (issue 42, item 1).

A crash-consistent copy of the data directory (an EBS, LVM or ZFS snapshot, a VM rollback) keeps everything
an LSN's identity is made of: the system identifier, the timeline, the slot and its saved creation LSN. Put
back in place, the server writes new transactions at the LSNs the lost history had used. Exactly-once delivery
must not take them for what its checkpoint in Kafka covers, once this server's WAL has passed the checkpoint;
at-least-once must not confirm to the restored slot what it acknowledged on the lost history."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.stream.test_checkpoint_identity import elsewhere
from tests.integration.stream.test_exactly_once import ids, read_all
from tests.plugins.pgcluster import RestorableCluster, restorable_cluster
from tests.plugins.pipeline import Outbox, wait_until
from tests.plugins.postgres import dsn_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def eo(outbox: Outbox, unique_name) -> dict[str, str]:
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    return {
        "CDC_DELIVERY": "exactly-once",
        "CDC_CHECKPOINT_TOPIC": checkpoints,
        "CDC_TRANSACTIONAL_ID": f"outbox-cdc.restore-{uuid.uuid4().hex}",
    }


@pytest.fixture
def restored(outbox: Outbox) -> Iterator[tuple[RestorableCluster, Outbox]]:
    """The test's outbox on a cluster of its own, set up, then copied while stopped: the snapshot that
    ``cluster.restore()`` puts back."""
    dbname = outbox.conn.info.dbname
    with restorable_cluster() as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname)))
        service = elsewhere(outbox, dsn_for(cluster.dsn, dbname=dbname))
        cluster.snapshot()
        service = reconnect(service)
        try:
            yield cluster, service
        finally:
            service.conn.close()


def reconnect(service: Outbox) -> Outbox:
    """The application's connection after the server was put back (the same Outbox, which the fixture
    closes)."""
    service.conn.close()
    service.conn = psycopg.connect(service.dsn, autocommit=True)
    service.transactions = []
    return service


def past(service: Outbox, lsn: int) -> None:
    """Write WAL on the server until its end is past ``lsn``: what any busy database soon does."""
    service.conn.execute("CREATE TABLE IF NOT EXISTS filler (n int)")
    while service.current_lsn() <= lsn:
        service.conn.execute("INSERT INTO filler SELECT generate_series(1, 100)")
        service.conn.execute("SELECT pg_switch_wal()")


def new_transactions(service: Outbox) -> set[str]:
    """Three transactions of four events each, committed on the restored server."""
    out: set[str] = set()
    for n in range(3):
        txn = service.commit([service.event(f"new-{n}-{i}") for i in range(4)])
        out |= set(txn.ids)
    return out


def test_exactly_once_after_a_restore_publishes_the_new_transactions_below_its_checkpoint(
    restored, pipeline_process, eo, kafka_bootstrap
):
    """The review's proof: 10 transactions published, the snapshot put back, 3 new transactions committed at
    LSNs below the checkpoint, the WAL pushed past it, `cdc run` started again. It skipped all 12 events
    "as already in Kafka", confirmed past them, and exited 0."""
    cluster, service = restored
    p1 = pipeline_process(**eo, CDC_DATABASE_URL=service.dsn)
    p1.wait_for_log(r"exactly-once: transactional id")
    for n in range(10):
        service.commit([service.event(f"old-{n}-{i}") for i in range(5)])
    checkpoint = service.transactions[-1].lsn_after
    wait_until(lambda: service.confirmed_lsn() >= checkpoint, 30, "the lost history confirmed")
    assert p1.terminate() == 0, p1.tail()

    cluster.restore()
    service = reconnect(service)
    assert service.confirmed_lsn() < checkpoint, "the restored slot must be back at the snapshot"
    fresh = new_transactions(service)
    assert service.transactions[-1].lsn_after < checkpoint, (
        "the new transactions must sit below the checkpoint"
    )
    past(service, checkpoint)

    p2 = pipeline_process(**eo, CDC_DATABASE_URL=service.dsn)
    p2.wait_for_log(r"exactly-once: transactional id")
    wait_until(
        lambda: service.confirmed_lsn() >= service.current_lsn() - 1, 60, "the restored slot confirmed"
    )
    seen = ids(read_all(kafka_bootstrap, service.topic("order")))
    missing = fresh - set(seen)
    assert not missing, f"{len(missing)} of the {len(fresh)} new events never reached Kafka:\n{p2.tail()}"
    assert all(seen[i] == 1 for i in fresh), seen.most_common(3)
    assert p2.terminate() == 0, p2.tail()
    assert "not of this server's history" in p2.log(), p2.tail()


def test_exactly_once_kept_running_across_a_restore_publishes_the_new_transactions(
    restored, pipeline_process, eo, kafka_bootstrap
):
    """The pipeline stays up: it loses the server, and reconnects to the restored one after its WAL passed the
    checkpoint that the pipeline holds in memory."""
    cluster, service = restored
    proc = pipeline_process(
        **eo, CDC_DATABASE_URL=service.dsn, CDC_BACKOFF_INITIAL="20", CDC_BACKOFF_MAX="20"
    )
    proc.wait_for_log(r"exactly-once: transactional id")
    for n in range(10):
        service.commit([service.event(f"old-{n}-{i}") for i in range(5)])
    checkpoint = service.transactions[-1].lsn_after
    wait_until(lambda: service.confirmed_lsn() >= checkpoint, 30, "the lost history confirmed")

    cluster.restore()  # the pipeline sees the connection go and waits backoff_initial (20 s) to reconnect
    service = reconnect(service)
    fresh = new_transactions(service)
    assert service.transactions[-1].lsn_after < checkpoint
    past(service, checkpoint)
    proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", 60)
    wait_until(
        lambda: service.confirmed_lsn() >= service.current_lsn() - 1, 60, "the restored slot confirmed"
    )
    seen = ids(read_all(kafka_bootstrap, service.topic("order")))
    missing = fresh - set(seen)
    assert not missing, f"{len(missing)} of the {len(fresh)} new events never reached Kafka:\n{proc.tail()}"
    assert all(seen[i] == 1 for i in fresh), seen.most_common(3)
    assert proc.terminate() == 0, proc.tail()
    assert "not of this server's history" in proc.log(), proc.tail()


def test_at_least_once_reconnected_to_a_restored_server_confirms_only_what_kafka_acknowledged(
    restored, pipeline_process, proxied_kafka
):
    """Reconnected to the restored server, the pipeline took it for the same history and started its
    watermark at what it had acknowledged there: the restored slot was confirmed past the new transactions
    before Kafka acknowledged any of them, and a kill -9 then lost them."""
    broker, proxy = proxied_kafka
    cluster, service = restored
    env = {"CDC_DATABASE_URL": service.dsn, "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
    proc = pipeline_process(**env)
    proc.wait_streaming()
    for n in range(10):
        service.commit([service.event(f"old-{n}-{i}") for i in range(5)])
    acknowledged = service.transactions[-1].lsn_after
    wait_until(lambda: service.confirmed_lsn() >= acknowledged, 30, "the lost history confirmed")

    proxy.freeze(new_too=True)  # from now on Kafka acknowledges nothing
    cluster.restore()
    service = reconnect(service)
    before = service.confirmed_lsn()
    fresh = new_transactions(service)
    assert service.transactions[-1].lsn_after < acknowledged
    proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", 60)
    wait_until(lambda: service.received_lsn() >= service.transactions[-1].lsn_after, 30, "the new ones read")
    confirmed = service.confirmed_lsn()
    assert confirmed < service.transactions[0].lsn_after, (
        f"the restored slot was confirmed to {confirmed:X} (from {before:X}) while Kafka acknowledged nothing"
    )
    proc.kill()
    proxy.thaw()
    again = pipeline_process(**env)
    again.wait_streaming()
    wait_until(lambda: service.confirmed_lsn() >= service.transactions[-1].lsn_after, 60, "confirmed again")
    seen = ids(read_all(broker.bootstrap, service.topic("order")))
    assert not fresh - set(seen), f"{len(fresh - set(seen))} new events lost"
    assert again.terminate() == 0, again.tail()
