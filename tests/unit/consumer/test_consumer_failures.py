"""The pure rules of cdc.consumer: retry schedule, what each exception leads to, dead-letter headers."""

from __future__ import annotations

import pytest
from psycopg import errors as pg_errors

from cdc.consumer import PermanentError, RetriesExhaustedError, RetryableError, RetryPolicy, classify
from cdc.consumer.failures import dead_letter_headers, error_reason
from cdc.errors import CdcError, ConfigError, ConsumerError, DeserializationError
from tests.unit.fake_message import Message


def test_the_backoff_doubles_up_to_the_cap_and_is_bounded_in_attempts():
    policy = RetryPolicy(attempts=6, initial=0.5, multiplier=2.0, max_delay=3.0, jitter=0.0)
    assert policy.schedule() == [0.5, 1.0, 2.0, 3.0, 3.0]  # attempts - 1 sleeps
    assert policy.worst_case() == 9.5
    assert [policy.delay(n) for n in range(1, 6)] == policy.schedule()
    assert RetryPolicy(attempts=1).schedule() == [], "one attempt: no retry at all"


def test_the_default_policy_is_five_attempts_within_eight_seconds():
    policy = RetryPolicy()
    assert policy.attempts == 5
    assert policy.schedule() == [0.5, 1.0, 2.0, 4.0]


def test_jitter_only_shortens_the_sleep():
    policy = RetryPolicy(initial=1.0, jitter=0.2)
    assert policy.delay(1, rand=lambda: 0.0) == 1.0
    assert policy.delay(1, rand=lambda: 0.999999) == pytest.approx(0.8, abs=1e-5)
    assert policy.delay(3, rand=lambda: 0.5) == pytest.approx(4.0 * 0.9)


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"initial": -1}, {"multiplier": 0.5}, {"initial": 5, "max_delay": 1}, {"jitter": 1.0}],
)
def test_a_nonsensical_policy_is_a_config_error(kwargs):
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("exc", "disposition"),
    [
        (RetryableError("payment service down"), "retry"),
        (pg_errors.SerializationFailure("could not serialize access"), "retry"),
        (pg_errors.DeadlockDetected("deadlock detected"), "retry"),
        (pg_errors.LockNotAvailable("lock timeout"), "retry"),
        (PermanentError("no such customer"), "dead_letter"),
        (DeserializationError("t[0]@1: not Avro"), "dead_letter"),
        (RuntimeError("a bug"), "crash"),
        (KeyError("amount_cents"), "crash"),
        (pg_errors.UniqueViolation("duplicate key"), "crash"),
        (pg_errors.OperationalError("server closed the connection"), "crash"),
        (RetriesExhaustedError("still failing"), "crash"),
    ],
)
def test_classify(exc, disposition):
    assert classify(exc) == disposition


def test_the_handler_facing_errors_sit_in_the_one_tree():
    for cls in (RetryableError, PermanentError, RetriesExhaustedError):
        assert issubclass(cls, ConsumerError) and issubclass(cls, CdcError)
    assert PermanentError("x").reason == "rejected"
    assert PermanentError("x", reason="no_total").reason == "no_total"


def test_error_reasons():
    assert error_reason(PermanentError("x", reason="no_total")) == "no_total"
    assert error_reason(DeserializationError("x")) == "undecodable"
    assert error_reason(RetriesExhaustedError("x")) == "retries_exhausted"
    assert error_reason(ValueError("x")) == "error"


def test_dead_letter_headers_put_the_error_first_and_keep_the_records_own():
    headers = dead_letter_headers(
        Message(_headers=[("id", b"e-1"), ("event_type", b"OrderPlaced"), ("traceparent", None)]),
        PermanentError("no such customer", reason="unknown_customer"),
        "inv",
    )
    assert headers == [
        ("error_class", b"PermanentError"),
        ("error_reason", b"unknown_customer"),
        ("error_message", b"no such customer"),
        ("original_topic", b"outbox.event.order"),
        ("original_partition", b"2"),
        ("original_offset", b"41"),
        ("consumer", b"inv"),
        ("id", b"e-1"),
        ("event_type", b"OrderPlaced"),
        ("traceparent", b""),
    ]


def test_a_long_error_message_is_cut_to_a_header_sized_one():
    headers = dict(dead_letter_headers(Message(_headers=[]), RetryableError("x" * 10_000), "inv"))
    assert len(headers["error_message"]) == 2000
