"""What /readyz and /healthz answer, read from the stream's one state: every reader agrees with the life."""

from __future__ import annotations

import time
from types import SimpleNamespace

from cdc.config_loader import load_settings
from cdc.stream.health import Health
from cdc.stream.life import Draining, Life, Reconnecting, Standby, Streaming, Waiting


class FakeSink:
    def __init__(self, reachable: bool = True, depth: int = 0) -> None:
        self.reachable, self.depth = reachable, depth

    def broker_reachable(self) -> bool:
        return self.reachable

    def queue_depth(self) -> int:
        return self.depth


def health(life: Life, *, source=None, sink=None) -> Health:
    settings = load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/d"}, overrides={}
    )
    confirmer = SimpleNamespace(source=source)
    return Health(settings, life, sink or FakeSink(), confirmer)  # type: ignore[arg-type]


def live_source(silent: float = 0.0):
    return SimpleNamespace(last_message_at=time.monotonic() - silent, silence=30.0)


def test_ready_only_while_streaming_or_waiting_with_postgresql_speaking():
    life = Life()
    assert health(life).not_ready() == ["not streaming from PostgreSQL (starting)"]
    life.to(Streaming(time.monotonic()))
    assert health(life, source=live_source()).not_ready() == []
    life.to(Waiting("the schema registry", time.monotonic()))
    assert health(life, source=live_source()).not_ready() == [], "a wait keeps the slot: still ready"
    assert health(life, source=live_source(45)).not_ready() == [
        "nothing from PostgreSQL for 45 s (source_silence_timeout)"
    ]


def test_each_state_that_does_not_stream_says_why():
    life = Life()
    life.to(Standby(time.monotonic()))
    [why] = health(life).not_ready()
    assert why.startswith("not streaming from PostgreSQL: a standby")
    life.to(Reconnecting(3, time.monotonic(), "connection refused"))
    assert health(life).not_ready() == [
        "not streaming from PostgreSQL: reconnecting (attempt 3): connection refused"
    ]
    life.to(Draining(time.monotonic() + 5))
    assert health(life, source=live_source()).not_ready() == ["not streaming from PostgreSQL (draining)"]


def test_kafka_that_does_not_answer_or_acknowledge_is_said_beside():
    life = Life()
    life.to(Streaming(time.monotonic()))
    assert health(life, source=live_source(), sink=FakeSink(reachable=False)).not_ready() == [
        "Kafka does not answer"
    ]
    life.acked_at = time.monotonic() - 500
    [why] = health(life, source=live_source(), sink=FakeSink(depth=7)).not_ready()
    assert why.startswith("7 events wait for Kafka's acknowledgement, none for 500 s")


def test_alive_while_the_loop_turns():
    life = Life()
    assert health(life).alive() is None
    life.turned_at = time.monotonic() - 500
    assert "has not turned for 500 s" in (health(life).alive() or "")
