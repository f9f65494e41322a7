"""The refusal ledger: which refused record goes alone, which one is the culprit, when it all is settled."""

from __future__ import annotations

import pytest

from cdc.errors import DeliveryError, EventRefusedError, EventTooLargeError
from cdc.stream.refusals import (
    MAX_REFUSALS,
    RefusalLedger,
    record_digest,
    safe_batch_size,
    worst_case_size,
)


class Err:
    def __init__(self, code: int, text: str = "Broker: refused") -> None:
        self._code, self._text = code, text

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return self._text


TOO_LARGE, INVALID_TIMESTAMP = Err(10, "Broker: Message size too large"), Err(32, "Broker: Invalid timestamp")
A, B = record_digest("t", b"k", b"a"), record_digest("t", b"k", b"b")


def test_the_digest_tells_topic_key_and_value_apart():
    assert (
        len(
            {
                record_digest("t", b"k", b"v"),
                record_digest("u", b"k", b"v"),
                record_digest("t", None, b"v"),
                record_digest("t", b"", b"v"),
                record_digest("t", b"k", b"w"),
            }
        )
        == 5
    )
    assert record_digest("t", b"ab", b"c") != record_digest("t", b"a", b"bc")


def test_a_size_refusal_gets_one_replay_with_fresh_limits_before_it_goes_alone():
    ledger = RefusalLedger()
    assert not ledger.active
    ledger.note([(A, TOO_LARGE), (B, TOO_LARGE)], alone=None, at=1, until=100)
    assert ledger.active and not ledger.must_go_alone(A)
    ledger.note([(A, TOO_LARGE)], alone=None, at=1, until=100)
    assert ledger.must_go_alone(A) and not ledger.must_go_alone(B)
    assert ledger.culprit_error(A, "t") is None


def test_any_other_refusal_goes_alone_at_once_and_refused_alone_is_the_culprit():
    ledger = RefusalLedger()
    ledger.note([(A, INVALID_TIMESTAMP), (B, INVALID_TIMESTAMP)], alone=None, at=1, until=100)
    assert ledger.must_go_alone(A) and ledger.must_go_alone(B)
    ledger.cleared(B)  # taken alone: only refused for its batch-mate
    assert not ledger.must_go_alone(B)
    ledger.note([], alone=A, at=1, until=100)  # no report came, but A was alone
    error = ledger.culprit_error(A, "t")
    assert isinstance(error, EventRefusedError) and error.reason == "refused_by_kafka"
    assert "Invalid timestamp" in error.message and not ledger.must_go_alone(A)


def test_a_culprit_refused_for_size_is_too_large():
    ledger = RefusalLedger()
    ledger.note([(A, TOO_LARGE)], alone=None, at=1, until=100)
    ledger.note([(A, TOO_LARGE)], alone=A, at=1, until=100)
    assert isinstance(ledger.culprit_error(A, "t"), EventTooLargeError)


def test_the_ledger_is_settled_once_the_slot_is_confirmed_past_every_refused_record():
    ledger = RefusalLedger()
    ledger.note([(A, INVALID_TIMESTAMP)], alone=A, at=1, until=100)
    ledger.settled(100)
    assert ledger.culprit_error(A, "t") is not None
    ledger.settled(101)
    assert not ledger.active and ledger.culprit_error(A, "t") is None


def test_a_record_refused_again_and_again_ends_the_run():
    ledger = RefusalLedger()
    with pytest.raises(DeliveryError, match="same record"):
        for _ in range(MAX_REFUSALS + 2):
            ledger.note([(A, TOO_LARGE)], alone=A, at=1, until=100)


def test_refusals_without_any_report_end_the_run_only_when_nothing_is_confirmed_in_between():
    ledger = RefusalLedger()
    for at in range(10):  # progress between them: fine
        ledger.note([], alone=None, at=at, until=100)
    with pytest.raises(DeliveryError, match="reported none"):
        for _ in range(MAX_REFUSALS + 1):
            ledger.note([], alone=None, at=50, until=100)


def test_batches_of_the_safe_size_fit_the_topic_even_incompressible():
    for limit in (1_000, 20_000, 1_048_588):
        size = safe_batch_size(limit)
        assert worst_case_size(size) <= limit < worst_case_size(size + 300)
    # The producer's own limit fits the broker's default: no check needed for default topics.
    assert worst_case_size(1_000_000) <= 1_048_588
