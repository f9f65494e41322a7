"""The two publishers at their own interface, against a fake transactional producer: the order of begin,
send, commit and abort, what may be confirmed before and after an abort, and the skip below a checkpoint
that holds only once its own transaction is read back."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc.config_loader import load_settings
from cdc.errors import DeliveryError, HistoryDivergedError, TransactionAbortedError
from cdc.stream import exactly_once as exactly_once_module
from cdc.stream.checkpoint import Acks
from cdc.stream.exactly_once import ExactlyOnce
from cdc.stream.identity import ServerIdentity, SlotIdentity
from cdc.stream.publisher import AtLeastOnce
from cdc.stream.transactions import Checkpoint

SERVER = ServerIdentity("7412", 1, flush_lsn=10_000)
SLOT = SlotIdentity("7412", "cdc_outbox", 100)


class FakeSink:
    """A transactional producer that notes what it is asked, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.transactional_id: str | None = None
        self.transaction_timeout_ms = 300_000
        self.fail_commit: KafkaException | None = None

    def become_transactional(self, tid: str) -> None:
        self.transactional_id = tid
        self.calls.append("init")

    def ensure_compacted_topic(self, topic: str, config: dict[str, str]) -> None:
        pass

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce_checkpoint(self, topic, key, value, waiting) -> None:
        self.calls.append("checkpoint")

    def commit_transaction(self, timeout: float) -> None:
        if self.fail_commit is not None:
            self.calls.append("commit failed")
            raise self.fail_commit
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def poll(self, timeout: float) -> int:
        return 0

    def reset(self) -> None:
        self.calls.append("reset")

    def shrink_batches(self, limit: int) -> None:
        self.calls.append(f"shrink {limit}")


def settings(**overrides):
    return load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"delivery": "exactly-once", "transaction_max_events": 3, **overrides},
    )


def exactly_once(monkeypatch, checkpoint: Checkpoint | None = None):
    monkeypatch.setattr(exactly_once_module, "read_checkpoint", lambda s, key, timeout: checkpoint)
    sink, acks = FakeSink(), Acks()
    publisher = ExactlyOnce(
        settings(),
        sink,  # type: ignore[arg-type]
        acks,
        keep_alive=lambda: None,
        pending_failure=lambda: False,
        shutdown_left=lambda: None,
    )
    return publisher, sink, acks


def source_transaction(acks: Acks, publisher, xid: int, commit_lsn: int, end_lsn: int, events: int = 1):
    """A source transaction read from the slot, its events produced and acknowledged by Kafka."""
    txn = acks.tracker.begin(xid, commit_lsn, 1_000_000 + xid)
    publisher.begin(commit_lsn)
    if not publisher.skipping:
        for _ in range(events):
            txn.sent()
            txn.delivered(None, None)
    acks.tracker.commit(txn, end_lsn)
    publisher.commit(txn, end_lsn, now=0.0, draining=False)
    return txn


def test_a_kafka_transaction_begins_with_a_source_one_and_commits_with_its_checkpoint(monkeypatch):
    publisher, sink, acks = exactly_once(monkeypatch)
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    source_transaction(acks, publisher, 1, 200, 210, events=2)
    assert sink.calls == ["init", "begin"]
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 100, "acknowledged, not committed"
    source_transaction(acks, publisher, 2, 300, 310, events=1)  # 3 events: transaction_max_events
    assert sink.calls == ["init", "begin", "checkpoint", "commit"]
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 310
    assert publisher.checkpoint == Checkpoint(310, 1_000_002, "7412", 1, xid=2)
    assert (publisher.commits, publisher.aborts) == (1, 0)


def test_a_commit_that_fails_is_aborted_and_only_what_committed_may_be_confirmed(monkeypatch):
    publisher, sink, acks = exactly_once(monkeypatch)
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    source_transaction(acks, publisher, 1, 200, 210, events=3)  # committed
    sink.fail_commit = KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer"))
    with pytest.raises(TransactionAbortedError, match="could not commit"):
        source_transaction(acks, publisher, 2, 300, 310, events=3)
    assert sink.calls[-3:] == ["checkpoint", "commit failed", "abort"]
    assert acks.tracker.confirmed_lsn == 210, "the aborted records were acknowledged, but never readable"
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 210
    assert (publisher.commits, publisher.aborts) == (1, 1)


def test_a_failed_delivery_inside_a_transaction_aborts_it_and_the_checkpoint_is_read_back(monkeypatch):
    reads = []
    monkeypatch.setattr(exactly_once_module, "read_checkpoint", lambda s, key, timeout: reads.append(key))
    publisher, sink, acks = exactly_once(monkeypatch)
    monkeypatch.setattr(exactly_once_module, "read_checkpoint", lambda s, key, timeout: reads.append(key))
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    source_transaction(acks, publisher, 1, 200, 210, events=1)
    with pytest.raises(TransactionAbortedError, match="Message timed out"):
        publisher.failed(DeliveryError("Local: Message timed out", lsn=200))
    assert sink.calls[-1] == "abort"
    publisher.start(SERVER, SLOT, first=False, confirmed=100)
    assert len(reads) == 2, "every abort reads the checkpoint back: a commit taken for failed may have landed"


def test_a_skip_below_the_checkpoint_holds_only_once_its_own_transaction_is_read_back(monkeypatch):
    checkpoint = Checkpoint(310, 1_000_002, "7412", 1, xid=2)
    publisher, _, acks = exactly_once(monkeypatch, checkpoint)
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    source_transaction(acks, publisher, 1, 200, 210)
    assert publisher.skipping and publisher.skipped == 1
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 100, "provisional: held at the slot"
    source_transaction(acks, publisher, 2, 300, 310)  # the checkpoint's own: the skip is sure
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 310


@pytest.mark.parametrize(
    "what",
    ["another transaction ends at the checkpoint", "a transaction commits past it", "the WAL passes it"],
)
def test_a_restored_servers_history_skips_nothing_below_the_checkpoint(monkeypatch, what):
    checkpoint = Checkpoint(310, 1_000_002, "7412", 1, xid=2)
    publisher, _, acks = exactly_once(monkeypatch, checkpoint)
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    source_transaction(acks, publisher, 7, 200, 210)  # a new transaction of the restored server
    with pytest.raises(HistoryDivergedError, match="not of this server's history"):
        if what.startswith("another"):
            source_transaction(acks, publisher, 8, 300, 310)
        elif what.startswith("a transaction"):
            source_transaction(acks, publisher, 8, 320, 330)
        else:
            publisher.keepalive(400)
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 100, "nothing confirmed past the slot"
    acks.restart(100)  # the next session, from the slot's position
    publisher.start(SERVER, SLOT, first=False, confirmed=100)
    source_transaction(acks, publisher, 7, 200, 210)
    assert not publisher.skipping, "that checkpoint is foreign now: nothing is skipped below it"


def test_at_least_once_confirms_what_kafka_acknowledged_and_ends_the_run_on_a_failure():
    emptied = []
    sink = FakeSink()
    publisher = AtLeastOnce(sink, lambda: emptied.append(True))  # type: ignore[arg-type]
    assert publisher.confirmable(12345) == 12345 and not publisher.skipping
    failure = DeliveryError("Local: Message timed out")
    with pytest.raises(DeliveryError) as raised:
        publisher.failed(failure)
    assert raised.value is failure
    publisher.shrink_batches("t", 50_000)
    assert emptied == [True] and sink.calls == ["shrink 50000"], "the queue empties before the swap"


class FlakySink(FakeSink):
    """Its first commits fail as Kafka says may be retried; its abort fails, or takes its timeout."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.abort_timeouts: list[float] = []
        self.fail_abort = False

    def commit_transaction(self, timeout: float) -> None:
        if self.failures:
            self.failures -= 1
            self.calls.append("commit failed")
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "slow", retriable=True))
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.abort_timeouts.append(timeout)
        self.calls.append("abort")
        if self.fail_abort:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone"))


def stopping(monkeypatch, sink: FakeSink, left: float):
    """An exactly-once publisher of a pipeline asked to stop: its keep-alive raises StopRequested, as the
    Confirmer's does then, and ``left`` seconds of shutdown_timeout remain."""
    from cdc.stream.waits import StopRequested

    def keep_alive() -> None:
        raise StopRequested

    monkeypatch.setattr(exactly_once_module, "read_checkpoint", lambda s, key, timeout: None)
    acks = Acks()
    publisher = ExactlyOnce(
        settings(),
        sink,  # type: ignore[arg-type]
        acks,
        keep_alive=keep_alive,
        pending_failure=lambda: False,
        shutdown_left=lambda: left,
    )
    publisher.start(SERVER, SLOT, first=True, confirmed=100)
    return publisher, acks


def test_stopping_a_retriable_commit_is_retried_within_shutdown_timeout(monkeypatch):
    """A stop must not leave the Kafka transaction open (read_committed readers of its partitions, the
    shared checkpoint topic's included, would wait for transaction.timeout.ms): the commit goes on."""
    sink = FlakySink(failures=2)
    publisher, acks = stopping(monkeypatch, sink, left=20.0)
    txn = acks.tracker.begin(1, 200, 1_000_001)
    publisher.begin(200)
    txn.sent()
    txn.delivered(None, None)
    acks.tracker.commit(txn, 210)
    publisher.commit(txn, 210, now=0.0, draining=False)  # one event of 3: the Kafka transaction stays open
    publisher.end(whole=True)
    assert sink.calls == ["init", "begin", "checkpoint", "commit failed", "commit failed", "commit"]
    assert publisher.confirmable(acks.tracker.confirmed_lsn) == 210
    assert (publisher.commits, publisher.aborts) == (1, 0)


def test_stopping_an_abort_takes_no_longer_than_shutdown_timeout_and_no_new_producer(monkeypatch):
    sink = FlakySink(failures=0)
    sink.fail_abort = True
    publisher, acks = stopping(monkeypatch, sink, left=3.5)
    acks.tracker.begin(1, 200, 1_000_001).sent()
    publisher.begin(200)
    with pytest.raises(TransactionAbortedError):
        publisher.end(whole=False)  # a source transaction cut short by the stop
    assert sink.abort_timeouts == [3.5]
    assert "reset" not in sink.calls, "no init_transactions of a new producer while stopping"
