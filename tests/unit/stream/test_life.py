"""The stream's life as a table of (state, next state): what may follow what, and what is refused."""

from __future__ import annotations

import logging

import pytest

from cdc.stream.life import (
    STATES,
    TRANSITIONS,
    Draining,
    IllegalTransition,
    Life,
    Reconnecting,
    Standby,
    Starting,
    Stopped,
    Streaming,
    Waiting,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(cls: type, now: float = 0.0):
    return {
        Starting: lambda: Starting(now),
        Standby: lambda: Standby(now),
        Streaming: lambda: Streaming(now),
        Waiting: lambda: Waiting("Kafka's queue", now),
        Reconnecting: lambda: Reconnecting(1, now, "lost"),
        Draining: lambda: Draining(now + 5),
        Stopped: lambda: Stopped("stopped on request", 0),
    }[cls]()


LEGAL = {
    Starting: {Standby, Streaming, Reconnecting, Draining, Stopped},
    Standby: {Streaming, Reconnecting, Draining, Stopped},
    Streaming: {Waiting, Reconnecting, Draining, Stopped},
    Waiting: {Streaming, Reconnecting, Draining, Stopped},
    Reconnecting: {Streaming, Reconnecting, Draining, Stopped},
    Draining: {Stopped},
    Stopped: set(),
}


@pytest.mark.parametrize("old", STATES, ids=lambda c: c.name)
@pytest.mark.parametrize("new", STATES, ids=lambda c: c.name)
def test_every_pair_of_states_is_legal_or_refused_as_the_table_says(old, new):
    life = Life(Clock())
    life.state = make(old)
    if new in LEGAL[old]:
        life.to(make(new))
        assert type(life.state) is new
    else:
        with pytest.raises(IllegalTransition):
            life.to(make(new))
        assert type(life.state) is old
    assert TRANSITIONS[old] == frozenset(LEGAL[old])


def test_a_recovery_is_logged_once_with_its_downtime(caplog):
    clock = Clock()
    life = Life(clock)
    with caplog.at_level(logging.INFO, logger="cdc.pipeline"):
        life.to(Streaming(clock()))
        life.to(Reconnecting(1, 110.0, "replication connection lost"))
        life.to(Reconnecting(2, 112.0, "connection refused"))
        life.to(Streaming(117.5))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "state: streaming",
        "state: reconnecting (attempt 1): replication connection lost",
        "state: reconnecting (attempt 2): connection refused",
        "state: streaming again after 7.5 s (reconnecting)",
    ]


def test_a_stop_request_is_a_flag_and_a_time_and_the_shutdown_budget_counts_from_it():
    clock = Clock()
    life = Life(clock)
    life.request_stop()
    assert life.stopping and life.stop_at == 100.0
    clock.now = 103.0
    life.request_stop()  # a second signal does not move the start of the budget
    assert life.shutdown_left(30, 5) == pytest.approx(22.0)
    assert type(life.state) is Starting, "the stream's thread moves the state, not the signal handler"


def test_a_wait_ends_back_in_streaming_unless_the_state_moved_on():
    life = Life(Clock())
    life.to(Streaming(1))
    life.to(Waiting("the schema registry", 2))
    life.back_to_streaming()
    assert type(life.state) is Streaming
    life.to(Draining(10))
    life.back_to_streaming()
    assert type(life.state) is Draining


def test_the_gauge_names_one_state():
    life = Life(Clock())
    life.to(Standby(1))
    gauge = life.gauge()
    assert gauge["standby"] == 1 and sum(gauge.values()) == 1 and len(gauge) == 7


def test_acknowledgements_move_the_acked_clock_only_when_their_count_moves():
    clock = Clock()
    life = Life(clock)
    life.turned(101.0, 0)
    assert life.turned_at == 101.0 and life.acked_at == 100.0
    life.turned(102.0, 5)
    assert life.acked_at == 102.0
    life.turned(103.0, 5)
    assert life.acked_at == 102.0 and life.turned_at == 103.0
