"""The consumer's per-record path (cdc.consumer.records.Records) at its interface, with fakes: Kafka records,
a handler, the service's connection over an in-memory guard table, and the dead-letter and done callables it
is given. What it decides for each outcome of a handler (tests/integration/consumer runs it for real)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

import pytest

from cdc.avro.deserialize import Event
from cdc.config import TableRef
from cdc.consumer import PermanentError, RetriesExhaustedError, RetryableError, RetryPolicy
from cdc.consumer.records import Records
from cdc.errors import DeserializationError, RegistryUnavailableError
from tests.unit.consumer.fakes import FakeConnection, Record, decode

NO_WAIT = RetryPolicy(attempts=3, initial=0.0, max_delay=0.0, jitter=0.0)


class Path:
    """A Records part with what it was given: ``conn``, ``letters`` (record, exception) it dead-lettered,
    ``finished`` records it reported done, ``counts``; the handler runs ``outcomes`` in turn (an exception
    is raised, anything else means the effect is written)."""

    def __init__(
        self,
        *outcomes: Any,
        retry: RetryPolicy = NO_WAIT,
        exhausted: Literal["stop", "dead_letter"] = "stop",
        deserializer: Any = decode,
    ) -> None:
        self.conn = FakeConnection()
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        self.letters: list[tuple[Any, BaseException, str | None]] = []
        self.finished: list[Any] = []
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}
        self.stop = threading.Event()
        self.records = Records(
            self.conn,  # type: ignore[arg-type]
            handler=self.handler,
            deserializer=deserializer,
            table=TableRef(schema="public", name="processed_events"),
            name="inv",
            retry=retry,
            on_retries_exhausted=exhausted,
            dead_letter=lambda message, exc, where: self.letters.append((message, exc, where)),
            done=lambda *messages: self.finished.extend(messages),
            stop=self.stop,
            counts=self.counts,
        )

    def handler(self, conn: Any, event: Event) -> None:
        self.calls.append(event.id)
        conn.execute("effect", (event.id,))
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome


def test_a_new_event_has_its_effect_and_guard_row_in_one_transaction_then_is_done() -> None:
    path, record = Path(), Record("e-1", offset=7)
    path.records.process(record)
    assert (path.conn.effects, path.conn.guard, path.conn.commits) == (["e-1"], {"e-1"}, 1)
    assert path.finished == [record] and path.counts["processed"] == 1


def test_an_event_processed_before_is_acknowledged_without_the_handler(caplog) -> None:
    path = Path()
    path.conn.guard.add("e-1")
    with caplog.at_level(logging.INFO, "cdc.consumer"):
        path.records.process(Record("e-1"))
    assert path.calls == [] and path.conn.effects == []
    assert path.counts == {"processed": 0, "duplicate": 1, "dead_lettered": 0, "retried": 0}
    assert len(path.finished) == 1
    assert "event 'e-1' was processed before: acknowledged without calling the handler" in caplog.text


@pytest.mark.parametrize(
    ("record", "reason"),
    [(Record("e-1", value=b"not avro"), DeserializationError), (Record(None), PermanentError)],
    ids=["undecodable", "no-id"],
)
def test_a_record_that_is_no_event_is_dead_lettered_unmarked_and_done(record: Record, reason: type) -> None:
    path = Path()
    path.records.process(record)
    ((message, exc, _),) = path.letters
    assert message is record and isinstance(exc, reason)
    if reason is PermanentError:
        assert exc.reason == "no_id"
    assert path.calls == [] and path.conn.guard == set() and path.finished == [record]


def test_a_permanent_error_rolls_back_and_dead_letters_the_record() -> None:
    path, record = Path(PermanentError("no such customer", reason="unknown_customer")), Record("e-1")
    path.records.process(record)
    assert path.conn.effects == [] and path.conn.guard == set(), "not marked: a replay of it is handled"
    ((message, exc, where),) = path.letters
    assert message is record and exc.reason == "unknown_customer"
    assert where == "event 'e-1' ('OrderPlaced') at outbox.event.order[0]@0"
    assert path.finished == [record]


def test_a_retryable_error_is_retried_within_the_policy_for_one_effect() -> None:
    path = Path(RetryableError("down"), RetryableError("still down"))
    path.records.process(Record("e-1"))
    assert path.calls == ["e-1"] * 3 and path.conn.effects == ["e-1"]
    assert (path.conn.rollbacks, path.counts["retried"], path.counts["processed"]) == (2, 2, 1)
    assert len(path.finished) == 1


def test_retries_exhausted_stop_the_consumer_unacknowledged() -> None:
    path = Path(*[RetryableError("down")] * 3)
    with pytest.raises(RetriesExhaustedError, match="still failing after 3 attempts"):
        path.records.process(Record("e-1"))
    assert path.finished == [] and path.letters == [] and path.conn.effects == []


def test_retries_exhausted_dead_letter_the_record_when_asked() -> None:
    path = Path(*[RetryableError("down")] * 3, exhausted="dead_letter")
    path.records.process(Record("e-1"))
    ((_, exc, _),) = path.letters
    assert isinstance(exc, RetriesExhaustedError) and len(path.finished) == 1


def test_a_stop_during_a_retry_leaves_the_record_unacknowledged() -> None:
    path = Path(RetryableError("down"), retry=RetryPolicy(attempts=3, initial=60.0, max_delay=60.0))
    path.stop.set()  # the retry's sleep ends at once
    path.records.process(Record("e-1"))
    assert path.calls == ["e-1"] and path.finished == [] and path.letters == []


def test_any_other_error_rolls_back_and_propagates_unacknowledged() -> None:
    path = Path(KeyError("amount_cents"))
    with pytest.raises(KeyError):
        path.records.process(Record("e-1"))
    assert (path.conn.effects, path.conn.guard, path.finished) == ([], set(), [])


def test_the_error_of_a_first_attempt_in_a_batch_counts_as_the_first_attempt() -> None:
    path, record = Path(), Record("e-1")
    event = decode(record)
    path.records.process(record, event, PermanentError("refused in its batch"))
    assert path.calls == [], "the handler is not called again for what it already refused"
    assert len(path.letters) == 1 and path.finished == [record]
    path.records.process(record, event, RetryableError("failed in its batch"))
    assert path.calls == ["e-1"] and path.counts["retried"] == 1 and path.conn.effects == ["e-1"]


def test_a_registry_that_does_not_answer_is_waited_for_then_stops_the_consumer() -> None:
    answers: list[Any] = [RegistryUnavailableError("registry down"), None]

    def deserializer(message: Any) -> Event:
        answer = answers.pop(0) if answers else RegistryUnavailableError("registry down")
        if isinstance(answer, BaseException):
            raise answer
        return decode(message)

    path = Path(deserializer=deserializer)
    path.records.process(Record("e-1"))
    assert path.conn.effects == ["e-1"] and path.letters == [], "an outage is not the record's fault"
    with pytest.raises(RegistryUnavailableError):
        path.records.process(Record("e-2"))
    assert len(path.finished) == 1
