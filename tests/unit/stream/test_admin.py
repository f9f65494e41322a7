"""cdc.stream.admin: "not yet" answers of a starting broker are asked again within the bound, anything else
is raised at once; and no code of the project calls the admin API that crashes librdkafka."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc.errors import SinkError
from cdc.stream import admin
from cdc.stream.admin import ask, kafka_error, settling

ROOT = Path(__file__).resolve().parents[3]


def failing(*codes: int, then: object = "answer"):
    """A call that raises KafkaException(code) for each of ``codes``, then returns ``then``; its calls and
    the seconds left it was given are in ``.calls``."""
    left = list(codes)

    def call(seconds_left: float) -> object:
        call.calls.append(seconds_left)  # type: ignore[attr-defined]
        if left:
            raise KafkaException(KafkaError(left.pop(0)))
        return then

    call.calls = []  # type: ignore[attr-defined]
    return call


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "FIRST_BACKOFF", 0.01)
    monkeypatch.setattr(admin, "MAX_BACKOFF", 0.02)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    ],
)
def test_a_broker_still_starting_is_asked_again(code: int, caplog: pytest.LogCaptureFixture) -> None:
    call = failing(code, code, code)
    caplog.set_level("INFO", logger="cdc.kafka.admin")
    assert ask(call, what="the offsets of t", bound=5) == "answer"
    assert len(call.calls) == 4
    assert all(0 < left <= 5 for left in call.calls)
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1, "one line per request, not one per attempt"
    assert told[0].startswith(f"the offsets of t: Kafka answered {KafkaError(code).name()}")


def test_anything_else_is_raised_at_once() -> None:
    call = failing(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException) as raised:
        ask(call, what="x", bound=5)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert len(call.calls) == 1


def test_an_unknown_topic_is_asked_again_only_when_it_is_known_to_exist() -> None:
    with pytest.raises(KafkaException):
        ask(failing(KafkaError.UNKNOWN_TOPIC_OR_PART), what="x", bound=5)
    assert ask(failing(KafkaError.UNKNOWN_TOPIC_OR_PART), what="x", bound=5, topic_expected=True) == "answer"


def test_the_bound_ends_the_asking_with_the_last_error() -> None:
    call = failing(*[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000)
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        ask(call, what="x", bound=0.3)
    assert time.monotonic() - started < 1.5
    assert raised.value.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    assert 3 <= len(call.calls) < 100


def test_an_error_wrapped_by_the_package_is_recognised() -> None:
    try:
        try:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        except KafkaException as exc:
            raise SinkError("reading the checkpoint topic") from exc
    except SinkError as wrapped:
        assert kafka_error(wrapped) is not None
        assert settling(wrapped)
    assert not settling(ValueError("no Kafka error in it"))
    assert not settling(None)


def test_nothing_calls_list_consumer_group_offsets() -> None:
    """librdkafka crashes (SIGSEGV in its own thread, no Python stack) when an admin client's
    ListConsumerGroupOffsets meets a coordinator that is starting or moving (cdc.stream.admin): the project
    reads committed offsets with a Consumer of the group. Only the reproductions may call it."""
    allowed = {Path("tests/faults/offset_fetch_crash.py")}
    call = re.compile(r"\.list_consumer_group_offsets\(")
    callers = [
        path.relative_to(ROOT)
        for folder in ("cdc", "tests", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if call.search(path.read_text(encoding="utf-8"))
    ]
    assert sorted(set(callers) - allowed) == []
