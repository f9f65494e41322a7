"""DeliveryFailures' judgement of a failed delivery, against a fake sink: which failures are records'
refusals to replay, and which end the run without confirming past them."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cdc.config_loader import load_settings
from cdc.errors import DeliveryError, DeliveryRefusedError
from cdc.stream.checkpoint import Acks, Transaction
from cdc.stream.failures import DeliveryFailures

SETTINGS = load_settings(
    config_file=None,
    environ={"CDC_DATABASE_URL": "postgresql://u@h/db", "CDC_KAFKA_BOOTSTRAP_SERVERS": "k:9092"},
    overrides={},
)
GAPLESS = KafkaError(
    KafkaError._GAPLESS_GUARANTEE,
    "ProduceRequest for t [2] with 223 message(s) failed: Local: Purged in queue: unable to satisfy gap-less "
    "guarantee",
    fatal=True,
)


class FakeSink:
    """What DeliveryFailures reads of the sink: a purge of its queue may stop the producer (``stops``)."""

    def __init__(self, *, fatal: KafkaError | None = None, stops: KafkaError | None = None) -> None:
        self.fatal_error = fatal
        self._stops = stops
        self.produced_topics: set[str] = set()
        self.purged = 0

    def purge_queue(self) -> None:
        self.purged += 1
        if self._stops is not None:
            self.fatal_error = self._stops

    def queue_depth(self) -> int:
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def check_rights(self, rights: object, timeout: float) -> None:
        pass


def judge(sink: FakeSink, acks: Acks) -> Exception:
    with pytest.raises((DeliveryError, DeliveryRefusedError)) as caught:
        DeliveryFailures(SETTINGS, sink, acks).fail()  # type: ignore[arg-type]
    return caught.value


def started(first_error: KafkaError | None) -> Acks:
    return started_transaction(first_error)[0]


def started_transaction(first_error: KafkaError | None) -> tuple[Acks, Transaction]:
    acks = Acks()
    txn = acks.tracker.begin(7, 0x100, 0)
    txn.sent()
    if first_error is not None:
        txn.delivered(first_error)
    return acks, txn


def test_a_timed_out_delivery_ends_the_run_even_when_the_purge_stops_the_producer_on_the_gapless_guarantee():
    # The producer's request timed out on a frozen connection; purging the batch it had already cut
    # stops the idempotent producer: that stop is the timeout's consequence, not a refusal to replay.
    sink = FakeSink(stops=GAPLESS)
    error = judge(sink, started(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out")))
    assert type(error) is DeliveryError, error
    assert "Message timed out; stopping without confirming past it" in str(error)
    assert error.lsn == 0x100
    assert sink.purged == 1


def test_a_gapless_stop_without_a_report_is_replayed_as_a_refusal():
    # confluent-kafka can lose the reports to the fatal error: the replay finds the culprit.
    error = judge(FakeSink(fatal=GAPLESS), started(None))
    assert isinstance(error, DeliveryRefusedError), error


@pytest.mark.parametrize("code", [KafkaError._PURGE_QUEUE, KafkaError._GAPLESS_GUARANTEE])
def test_a_gapless_stop_whose_reports_are_its_own_consequences_is_replayed(code):
    error = judge(FakeSink(fatal=GAPLESS), started(KafkaError(code)))
    assert isinstance(error, DeliveryRefusedError), error


def test_a_record_too_large_is_a_refusal_to_replay():
    acks, txn = started_transaction(None)

    class Msg:
        def topic(self):
            return "t"

        def key(self):
            return b"k"

        def value(self):
            return b"v"

    txn.delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Msg())
    error = judge(FakeSink(fatal=GAPLESS), acks)
    assert isinstance(error, DeliveryRefusedError)
    assert len(error.refused) == 1
