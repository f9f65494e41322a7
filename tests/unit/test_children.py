"""tests.children: a harness killed with kill -9 takes its children with it, and its watchdog cleans up what
is not its child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

# A harness: starts `sleep 600` as its child (with die_with_parent, unless told not to), prints its pid.
HARNESS = """
import subprocess, sys, time
from tests.children import die_with_parent
guard = sys.argv[1] == "guard"
child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent() if guard else None)
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
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def kill_9(harness: subprocess.Popen[str]) -> None:
    harness.send_signal(signal.SIGKILL)
    harness.wait(10)
    assert harness.stdout is not None
    harness.stdout.close()


def test_a_child_dies_with_its_harness_killed_with_kill_9() -> None:
    harness, pid = start(HARNESS, "guard")
    child = int(pid)
    assert alive(child)
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
