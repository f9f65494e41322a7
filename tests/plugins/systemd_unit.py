"""systemd's restart rules, read from a unit file and applied to real processes, without systemd.

:func:`restart_policy` reads what decides whether systemd starts a service again after its main process
exits: ``Restart=``, ``RestartSec=``, ``RestartPreventExitStatus=``, ``SuccessExitStatus=`` and the start
limit (``StartLimitIntervalSec=``, ``StartLimitBurst=``, with systemd's defaults of 10 s and 5). Its
:meth:`RestartPolicy.restarts` answers as systemd.service(5) says. :class:`UnitSupervisor` keeps a process
running by those rules, as systemd would: each start is a new process, made by the caller's ``spawn``.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# systemd.service(5): "clean" exits (0, or SIGHUP, SIGINT, SIGTERM, SIGPIPE, plus SuccessExitStatus=).
_CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}
# Restart= setting -> (restart after a clean exit, after an unclean exit code, after a signal).
_RESTART = {
    "no": (False, False, False),
    "always": (True, True, True),
    "on-success": (True, False, False),
    "on-failure": (False, True, True),
    "on-abnormal": (False, False, True),
    "on-abort": (False, False, True),
    "on-watchdog": (False, False, False),
}


def _seconds(text: str) -> float:
    """A systemd time span: ``5``, ``5s``, ``500ms``, ``1min 30s``, ``infinity``."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "": 1}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text):
        total += float(number) * units[unit]
    return total


def _statuses(text: str) -> set[int | signal.Signals]:
    out: set[int | signal.Signals] = set()
    for word in text.split():
        out.add(
            int(word) if word.isdigit() else signal.Signals[word if word.startswith("SIG") else f"SIG{word}"]
        )
    return out


def unit_settings(path: Path) -> dict[str, dict[str, str]]:
    """section -> key -> value of a unit file (a key given twice: the last one, as systemd does for these)."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current[key.strip()] = value.strip()
    return sections


@dataclass(frozen=True)
class RestartPolicy:
    restart: str = "no"
    restart_sec: float = 0.1  # systemd's default RestartSec=100ms
    prevent: frozenset[int | signal.Signals] = frozenset()
    success: frozenset[int | signal.Signals] = frozenset()
    start_limit_interval: float = 10.0
    start_limit_burst: int = 5

    def restarts(self, returncode: int) -> bool:
        """Whether systemd starts the service again after its main process ended with ``returncode``
        (subprocess's convention: negative for a signal), the service not being stopped on purpose."""
        status: int | signal.Signals = signal.Signals(-returncode) if returncode < 0 else returncode
        if status in self.prevent:
            return False
        on_clean, on_code, on_signal = _RESTART[self.restart]
        clean = status == 0 or status in self.success or status in _CLEAN_SIGNALS
        if clean:
            return on_clean
        return on_signal if isinstance(status, signal.Signals) else on_code


def restart_policy(path: Path) -> RestartPolicy:
    units = unit_settings(path)
    service, unit = units.get("Service", {}), units.get("Unit", {})
    return RestartPolicy(
        restart=service.get("Restart", "no"),
        restart_sec=_seconds(service.get("RestartSec", "100ms")),
        prevent=frozenset(_statuses(service.get("RestartPreventExitStatus", ""))),
        success=frozenset(_statuses(service.get("SuccessExitStatus", ""))),
        start_limit_interval=_seconds(unit.get("StartLimitIntervalSec", "10s")),
        start_limit_burst=int(unit.get("StartLimitBurst", "5")),
    )


class Process(Protocol):
    def wait(self, timeout: float = ...) -> int: ...

    def terminate(self, timeout: float = ...) -> int: ...

    def alive(self) -> bool: ...


@dataclass
class Exit:
    start: int  # which start (1-based)
    code: int
    at: float  # monotonic


@dataclass
class UnitSupervisor:
    """Runs ``spawn()`` and, each time the process exits, starts it again after ``RestartSec`` when the
    policy says systemd would; ``gave_up`` says why it stopped doing so (an exit status that prevents a
    restart, the start limit)."""

    policy: RestartPolicy
    spawn: Callable[[], Process]
    exits: list[Exit] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    gave_up: str | None = None
    current: Process | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="unit-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            window = [t for t in self.starts if now - t < self.policy.start_limit_interval]
            if self.policy.start_limit_interval > 0 and len(window) >= self.policy.start_limit_burst:
                self.gave_up = "start-limit-hit"
                return
            self.starts.append(now)
            proc = self.current = self.spawn()
            if self._stopping.is_set():  # stop() came while it started
                proc.terminate()
                return
            code = proc.wait(timeout=24 * 3600)
            self.exits.append(Exit(len(self.starts), code, time.monotonic()))
            if self._stopping.is_set():
                return
            if not self.policy.restarts(code):
                self.gave_up = f"exit status {code}: no restart (Restart={self.policy.restart})"
                return
            self._stopping.wait(self.policy.restart_sec)

    def running(self) -> bool:
        return self.current is not None and self.current.alive()

    def stop(self, timeout: float = 60.0) -> int | None:
        """``systemctl stop``: SIGTERM to the process, no restart after it."""
        self._stopping.set()
        code = None
        if self.current is not None and self.current.alive():
            code = self.current.terminate(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
        return code
