"""sd_notify for `cdc run` (cdc.notify), through a real unix datagram socket: READY once streaming, WATCHDOG
every half WatchdogSec while the loop turns and never once it stopped, the abstract namespace, and nothing
without NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from cdc.notify import Notifier


class Pipeline:
    """What the notifier asks: a pure stand-in for cdc.stream.health.Health's two answers."""

    def __init__(self) -> None:
        self.streaming_for: float | None = None
        self.stuck: str | None = None

    def alive(self) -> str | None:
        return self.stuck

    def seconds_since_server_message(self) -> float | None:
        return self.streaming_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def systemd(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(0)
    yield str(path), sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_ready_once_streaming_and_a_watchdog_every_half_period_while_the_loop_turns(systemd):
    path, sock = systemd
    pipeline, clock = Pipeline(), Clock()
    notifier = Notifier(pipeline, path, watchdog=30.0, clock=clock)
    notifier.beat()
    assert received(sock) == ["WATCHDOG=1"]  # starting: the loop turns, not ready yet
    pipeline.streaming_for = 0.1
    clock.now += 1
    notifier.beat()
    assert received(sock) == ["READY=1\nSTATUS=streaming"]
    clock.now += 13
    notifier.beat()
    assert received(sock) == []  # 14 s since the last one: not due before half of 30 s
    clock.now += 1
    notifier.beat()
    assert received(sock) == ["WATCHDOG=1"]
    pipeline.stuck = "the stream's loop has not turned for 130 s (liveness_timeout)"
    for _ in range(5):
        clock.now += 20
        notifier.beat()
    # No more WATCHDOG=1: systemd ends the process WatchdogSec after the last one. The reason, once.
    assert received(sock) == [f"STATUS={pipeline.stuck}"]
    notifier.stopping()
    assert received(sock) == ["STOPPING=1\nSTATUS=stopping: waiting for in-flight acknowledgements"]
    notifier.close()


def test_the_environment_decides(systemd):
    path, _ = systemd
    assert Notifier.from_environment(Pipeline(), {}) is None
    plain = Notifier.from_environment(Pipeline(), {"NOTIFY_SOCKET": path})
    assert plain is not None and plain.watchdog is None
    mine = Notifier.from_environment(
        Pipeline(), {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert mine is not None and mine.watchdog == 20.0
    other = Notifier.from_environment(
        Pipeline(), {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}
    )
    assert other is not None and other.watchdog is None  # the watchdog is another process's
    for notifier in (plain, mine, other):
        notifier.close()


def test_the_abstract_namespace_and_a_socket_nobody_listens_on():
    name = f"cdc-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        pipeline = Pipeline()
        pipeline.streaming_for = 1.0
        notifier = Notifier(pipeline, "@" + name)
        notifier.beat()
        assert sock.recv(4096) == b"READY=1\nSTATUS=streaming"
        notifier.close()
    finally:
        sock.close()
    gone = Notifier(Pipeline(), "@" + name)
    assert gone.send("READY=1") is False  # nobody listens: said, never raised
    gone.close()
