"""Keeps `cdc run` running, as systemd's ``Restart=always`` would: whenever it exits, start it again.

Every start logs to a file of its own (``pipeline-<n>.log`` in the run's directory). A ``kill -9`` from the
fault schedule sets the delay before the next start (0-3 s); any other exit is restarted after 1 s, and
noted: an exit the schedule did not cause is worth reading even when nothing was lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.children import dying_with_parent
from tests.faults.stack import ROOT

RESTART_DELAY = 1.0


def start_cdc_run(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """`python -m cdc run` from the repository root, its output in ``log_path``; it dies with the thread
    that starts it (tests.children): the supervisor's thread, which ends only after the run's last
    `cdc run`, or the main thread."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "cdc", "run"]),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@dataclass(frozen=True, slots=True)
class Exit:
    start: int  # which start (1-based)
    code: int
    killed: bool  # by the schedule's kill -9
    lived: float  # seconds
    reason: str = ""  # the start's last "cdc: error:" line, for an exit the schedule did not cause


class Supervisor:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.exits: list[Exit] = []
        self.starts = 0
        self.kills = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._killed_by_us = False
        self._delay = RESTART_DELAY
        self._paused = threading.Event()
        self._stopping = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def log_path(self, start: int) -> Path:
        return self.log_dir / f"pipeline-{start}.log"

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        return start_cdc_run(self.env, self.log_path(self.starts))

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                self._proc = proc = self._spawn()
                self._killed_by_us = False
            started = time.monotonic()
            code = proc.wait()
            with self._lock:
                if self._stopping:  # the final SIGTERM: its exit code is stop()'s to report
                    self._proc = None
                    return
                reason = "" if self._killed_by_us else _error_line(self.log_path(self.starts))
                self.exits.append(
                    Exit(self.starts, code, self._killed_by_us, time.monotonic() - started, reason)
                )
                delay, self._delay = (self._delay if self._killed_by_us else RESTART_DELAY), RESTART_DELAY
                self._proc = None
                if self._stopping:
                    return
            self._wake.clear()
            self._wake.wait(delay)
            while self._paused.is_set() and not self._stopping:
                time.sleep(0.05)

    def kill(self, restart_after: float) -> bool:
        """``kill -9`` of the running pipeline; False when none was running (between two starts)."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                return False
            self._killed_by_us = True
            self._delay = restart_after
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # it exited by itself a moment ago, and was reaped: not our kill
                self._killed_by_us = False
                return False
            self.kills += 1
            return True

    def pause(self) -> None:
        """Kill the pipeline and start no new one until `resume()`."""
        self._paused.set()
        while not self.kill(0) and self.running():
            time.sleep(0.05)
        while self.running():
            time.sleep(0.05)

    def resume(self) -> None:
        self._paused.clear()

    def running(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM, as at the end of a deployment; returns the exit code (None if it had to be killed)."""
        with self._lock:
            self._stopping = True
            proc = self._proc
        self._paused.clear()
        self._wake.set()
        if proc is None:
            self._thread.join(timeout=10)
            return None
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        self._thread.join(timeout=10)
        return code

    def unexpected_exits(self) -> list[Exit]:
        return [e for e in self.exits if not e.killed]


def _error_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("cdc: error:")]
    return lines[-1] if lines else ""
