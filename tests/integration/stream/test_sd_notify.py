"""`cdc run` under systemd's Type=notify (issue 43, item 10), with a real unix datagram socket where systemd's
would be: READY=1 once it streams (not before), WATCHDOG=1 every half WatchdogSec while it runs, STOPPING=1
at SIGTERM, then exit 0."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.plugins.pipeline import Outbox

pytestmark = pytest.mark.integration


def test_cdc_run_notifies_ready_watchdog_and_stopping(outbox: Outbox, pipeline_process, tmp_path: Path):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(30)
    try:
        proc = pipeline_process(NOTIFY_SOCKET=str(path), WATCHDOG_USEC="2000000")
        messages: list[tuple[float, str]] = []

        def until(wanted: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    text = sock.recv(4096).decode()
                except TimeoutError:
                    break
                messages.append((time.monotonic(), text))
                if wanted in text:
                    return
            raise AssertionError(f"no {wanted!r} within {timeout} s; got {messages}\n{proc.tail()}")

        until("READY=1", 60)
        assert "streaming from slot" in proc.log(), "READY=1 before the pipeline streamed"
        ready_at = messages[-1][0]
        with pytest.raises(AssertionError):
            until("nothing of the kind", 3.5)  # listen for 3.5 s
        watchdogs = [t for t, text in messages if text == "WATCHDOG=1" and t > ready_at]
        assert len(watchdogs) >= 3, messages  # one a second with WatchdogSec = 2
        assert proc.alive()
        proc.proc.terminate()
        until("STOPPING=1", 10)
        assert proc.wait(60) == 0, proc.tail()
    finally:
        sock.close()
