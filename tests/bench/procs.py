"""The pipeline as a subprocess (`python -m cdc run`, optionally under cProfile or py-spy), and sampling of a
process's RSS, CPU time, open file descriptors and threads from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.children import dying_with_parent

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _status_mib(pid: int, field: str) -> float | None:
    """A ``kB`` field of /proc/<pid>/status in MiB, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MiB, or None when the process is gone."""
    return _status_mib(pid, "VmRSS:")


def vmhwm_mb(pid: int) -> float | None:
    """The peak resident set size of ``pid`` (VmHWM) in MiB, or None when the process is gone."""
    return _status_mib(pid, "VmHWM:")


def open_fds(pid: int) -> int | None:
    """How many file descriptors ``pid`` has open (sockets, pipes, files), or None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


def threads(pid: int) -> int | None:
    """The number of threads of ``pid`` (``Threads:`` of /proc/<pid>/status), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def thread_cpu_seconds(pid: int | None) -> dict[str, float]:
    """CPU time of the threads of ``pid`` by name, from each thread's schedstat (nanoseconds, where stat
    counts clock ticks of 10 ms); empty when it is gone. The main thread is ``main``; Python 3.11 names
    no other thread, so Python's others (the span exporter's, the metrics server's) are summed as
    ``python``, and librdkafka's are ``rdk:main``, ``rdk:broker1``...."""
    out: dict[str, float] = {}
    if pid is None:
        return out
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return out
    for tid in tids:
        try:
            task = f"/proc/{pid}/task/{tid}"
            with open(f"{task}/comm") as comm, open(f"{task}/schedstat") as stat:
                name, ns = comm.read().strip(), int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
        name = "main" if tid == str(pid) else name
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def _stat_fields(pid: int | None) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None when it is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of ``pid`` (all its threads), or None when it is gone or unknown."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU time of ``pid``, of its children that it has reaped (cutime + cstime) and of its live children: all
    a server spent that forks a process per connection (PostgreSQL's postmaster); None when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    total = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime (fields 14 to 17)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        child = _stat_fields(int(entry))
        if child is not None and int(child[1]) == pid:
            total += int(child[11]) + int(child[12])
    return total / CLOCK_TICKS


class MachineCpu:
    """Machine-wide CPU use from creation to ``read()`` (/proc/stat): cores busy, and stolen by the host."""

    def __init__(self) -> None:
        self._start = self._stat()

    @staticmethod
    def _stat() -> tuple[int, int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + values[4]  # idle, iowait
        steal = values[7] if len(values) > 7 else 0
        total = sum(values[:8])
        return total - idle - steal, steal, total

    def read(self) -> dict[str, float]:
        busy, steal, total = (b - a for a, b in zip(self._start, self._stat(), strict=True))
        cpus = len(os.sched_getaffinity(0))
        if total <= 0:
            return {}
        return {"busy_cores": round(cpus * busy / total, 2), "steal_cores": round(cpus * steal / total, 2)}


class Sampler(threading.Thread):
    """RSS of one process every ``interval`` seconds: (seconds since start, MiB)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(name=f"rss-{pid}", daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.is_set():
            value = rss_mb(self.pid)
            if value is None:
                return
            self.samples.append((round(time.monotonic() - self._t0, 2), round(value, 1)))
            self._stop_event.wait(self.interval)

    def stop(self) -> list[tuple[float, float]]:
        self._stop_event.set()
        self.join(5)
        return self.samples


def summarize_rss(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, Any]:
    """Peak over all samples, and the values at 10 %, 50 % and 90 % of the window [start, end] (seconds since
    the process started): the measured phase, after start-up."""
    if not samples:
        return {"samples": 0}
    span = end - start

    def at(fraction: float) -> float:
        goal = start + span * fraction
        return min(samples, key=lambda s: abs(s[0] - goal))[1]

    return {
        "peak_mb": max(v for _, v in samples),
        "window_s": [round(start, 2), round(end, 2)],
        "at_10pct_mb": at(0.1),
        "at_50pct_mb": at(0.5),
        "at_90pct_mb": at(0.9),
        "growth_10_to_90pct_mb": round(at(0.9) - at(0.1), 1),
        "samples": len(samples),
        "series": [[t, v] for t, v in samples],
    }


class PipelineProcess:
    """`python -m cdc run` with the given environment; stderr and stdout go to ``log_path``."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        *,
        cprofile_out: Path | None = None,
        pyspy_out: Path | None = None,
    ) -> None:
        self.log_path = log_path
        self.pyspy_out = pyspy_out
        self._pyspy: subprocess.Popen[bytes] | None = None
        command = [sys.executable]
        if cprofile_out is not None:
            command += ["-m", "cProfile", "-o", str(cprofile_out)]
        command += ["-m", "cdc", "run"]
        self._log = open(log_path, "ab")  # closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            dying_with_parent(command),
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid
        if pyspy_out is not None:
            pyspy = Path(sys.executable).parent / "py-spy"
            self._pyspy = subprocess.Popen(
                dying_with_parent(
                    [str(pyspy), "record", "--pid", str(self.pid), "--rate", "200", "--nonblocking", "--idle"]
                    + ["--format", "raw", "--output", str(pyspy_out)]
                ),
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60) -> dict[str, Any]:
        """SIGTERM (a graceful stop), then SIGKILL after ``timeout`` s; returns the exit code and the time."""
        started = time.monotonic()
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                killed = True
        if self._pyspy is not None:
            try:
                self._pyspy.wait(30)  # py-spy writes its file when its target exits
            except subprocess.TimeoutExpired:
                self._pyspy.send_signal(signal.SIGINT)
                self._pyspy.wait(10)
        self._log.close()
        return {
            "exit_code": self.proc.returncode,
            "killed": killed,
            "stop_seconds": round(time.monotonic() - started, 2),
        }
