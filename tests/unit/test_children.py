"""tests.children: a harness killed with kill -9 takes its children with it, and its watchdog cleans up what
is not its child."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

# A harness: starts `sleep 600` as its child (with dying_with_parent, unless told not to), prints its pid.
# Like a test process after the tracing tests, it has an at-fork hook that takes a lock another thread holds
# (OpenTelemetry's SDK registers such hooks): a child started with a preexec_fn would run it, and wait.
HARNESS = """
import os, subprocess, sys, threading, time
from tests.children import dying_with_parent
held = threading.Lock()
threading.Thread(target=lambda: (held.acquire(), time.sleep(600)), daemon=True).start()
time.sleep(0.2)
os.register_at_fork(after_in_child=lambda: held.acquire())
guard = sys.argv[1] == "guard"
child = subprocess.Popen(dying_with_parent(["sleep", "600"]) if guard else ["sleep", "600"])
print(child.pid, flush=True)
time.sleep(600)
"""
WATCHED = """
import sys, time
from tests.children import watchdog
dog = watchdog(["touch", sys.argv[1]])
if sys.argv[2] == "disarm":
    dog.disarm()
print("ready", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def start(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """The harness, and the first line it prints within 10 s (a harness stuck starting its child fails)."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        pytest.fail("the harness did not start its child within 10 s")
    return proc, proc.stdout.readline().strip()


def kill_9(harness: subprocess.Popen[str]) -> None:
    harness.send_signal(signal.SIGKILL)
    harness.wait(10)
    assert harness.stdout is not None
    harness.stdout.close()


def test_a_child_dies_with_its_harness_killed_with_kill_9() -> None:
    harness, pid = start(HARNESS, "guard")
    child = int(pid)
    try:
        assert alive(child)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child}/cmdline").read_bytes() != b"sleep\x00600\x00":  # setpriv execs it: one pid
            assert time.monotonic() < deadline, "setpriv did not exec the command"
            time.sleep(0.05)
    finally:
        kill_9(harness)
    assert gone_within(child, 3), f"child {child} outlived its harness"


def test_without_it_the_child_is_orphaned() -> None:
    """The control: what the harnesses did before (the soak's `cdc run` and consumer went on retrying)."""
    harness, pid = start(HARNESS, "none")
    child = int(pid)
    try:
        kill_9(harness)
        assert not gone_within(child, 1.5)
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("disarm", [False, True])
def test_the_watchdog_cleans_up_when_its_harness_dies(tmp_path: Path, disarm: bool) -> None:
    done = tmp_path / "cleaned-up"
    harness, ready = start(WATCHED, str(done), "disarm" if disarm else "keep")
    assert ready == "ready"
    kill_9(harness)
    deadline = time.monotonic() + (1.5 if disarm else 10)
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists() is not disarm
