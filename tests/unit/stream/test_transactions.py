"""Exactly-once bookkeeping: the checkpoint record, when a Kafka transaction is due, and which failures
fence the pipeline."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from cdc.config_loader import load_settings
from cdc.errors import ProducerFencedError, TransactionAbortedError
from cdc.stream.identity import SlotIdentity
from cdc.stream.transactions import (
    Checkpoint,
    KafkaTransaction,
    classify,
    database_of,
    transactional_id,
)


def settings(**overrides):
    return load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/shop"},
        overrides={"delivery": "exactly-once", **overrides},
    )


def test_the_checkpoint_round_trips_with_the_wal_history_it_was_written_on():
    cp = Checkpoint(end_lsn=0x1_0000_00A0, commit_time_us=1_796_000_000_123_456, system_id="7412", timeline=3)
    value = cp.encode(SlotIdentity("7412", "cdc_outbox", 0x16B3748), database="shop")
    assert b'"end_lsn":"1/A0"' in value and b'"slot":"cdc_outbox"' in value
    assert b'"slot_created_lsn":"0/16B3748"' in value and b'"database":"shop"' in value
    assert Checkpoint.decode(value) == cp


def test_the_checkpoint_keeps_its_last_transactions_xid_and_reads_one_written_without_it():
    cp = Checkpoint(0x1A8A248, 1_796_000_000_123_456, "7412", 1, xid=3555)
    value = cp.encode(SlotIdentity("7412", "cdc_outbox", None), database="shop")
    assert b'"xid":3555' in value and Checkpoint.decode(value) == cp
    older = value.replace(b',"xid":3555', b"")
    assert Checkpoint.decode(older) == Checkpoint(0x1A8A248, 1_796_000_000_123_456, "7412", 1, xid=None)


def test_a_transaction_read_back_is_the_checkpoints_only_with_its_end_xid_and_commit_time():
    """A restored server writes other transactions at the same LSNs: the end LSN alone proves nothing."""
    cp = Checkpoint(0x1A8A248, 1_796_000_000_123_456, "7412", 1, xid=3555)
    assert cp.is_transaction(0x1A8A248, 3555, 1_796_000_000_123_456)
    assert not cp.is_transaction(0x1A8A248, 3555, 1_796_000_000_123_457)  # committed at another time
    assert not cp.is_transaction(0x1A8A248, 3556, 1_796_000_000_123_456)  # another transaction
    assert not cp.is_transaction(0x1A8A250, 3555, 1_796_000_000_123_456)  # ends elsewhere
    legacy = Checkpoint(0x1A8A248, 1_796_000_000_123_456, "7412", 1)
    assert legacy.is_transaction(0x1A8A248, 9, 1_796_000_000_123_456)  # no xid kept: end and time decide
    assert not legacy.is_transaction(0x1A8A248, 9, 1_796_000_000_000_000)


def test_ids_and_keys_come_from_the_server_and_the_slot_not_the_url():
    s = settings()
    assert database_of(s) == "shop"  # for people reading the checkpoint only
    assert transactional_id(s, "7412") == "outbox-cdc.7412.cdc_outbox"
    assert transactional_id(settings(transactional_id="billing-relay"), "7412") == "billing-relay"
    assert SlotIdentity("7412", "cdc_outbox", 0x16B3748).key == b"7412/cdc_outbox@0/16B3748"
    assert SlotIdentity("7412", "cdc_outbox", None).key == b"7412/cdc_outbox"


def test_a_transaction_is_due_by_events_or_by_age():
    ktx = KafkaTransaction(settings(transaction_max_events=100, transaction_max_seconds=0.5))
    assert not ktx.due(10.0)
    ktx.begun(10.0)
    ktx.events = 99
    assert not ktx.due(10.4)
    assert ktx.due(10.5)
    ktx.events = 100
    assert ktx.due(10.0)


def test_a_transaction_grows_older_while_the_pipeline_drains_a_backlog():
    ktx = KafkaTransaction(settings(transaction_max_events=100, transaction_max_seconds=0.1))
    ktx.begun(10.0)
    assert ktx.due(10.11) and not ktx.due(10.11, draining=True)
    assert not ktx.due(10.99, draining=True) and ktx.due(11.0, draining=True)
    ktx.events = 100
    assert ktx.due(10.0, draining=True)


def test_fencing_ends_the_run_and_other_failures_abort_and_restart():
    fenced = classify(KafkaException(KafkaError(KafkaError.PRODUCER_FENCED)), "commit", "outbox-cdc.x.y")
    assert isinstance(fenced, ProducerFencedError) and "outbox-cdc.x.y" in str(fenced)
    assert isinstance(
        classify(KafkaException(KafkaError(KafkaError._FENCED)), "commit", "t"), ProducerFencedError
    )
    timed_out = classify(KafkaException(KafkaError(KafkaError._TIMED_OUT)), "commit", "t")
    assert isinstance(timed_out, TransactionAbortedError) and not isinstance(timed_out, ProducerFencedError)


def test_fencing_by_a_transaction_timeout_says_so_and_not_another_process():
    fenced = KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))
    timed_out = classify(fenced, "commit", "outbox-cdc.x.y", open_for=310.0, timeout_ms=300_000)
    assert isinstance(timed_out, ProducerFencedError)
    assert "open for 310 s, past kafka.transaction.timeout.ms (300000 ms)" in str(timed_out)
    assert "another process" not in str(timed_out)
    other = classify(fenced, "commit", "outbox-cdc.x.y", open_for=2.0, timeout_ms=300_000)
    assert "another process started with transactional id 'outbox-cdc.x.y'" in str(other)
