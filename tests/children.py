"""The processes a test harness starts (`cdc run`, consumers, loaders, brokers, Kafka Connect): they die with
the harness however it dies, and a native crash in any of them, or in the harness, leaves a Python stack.

- :func:`dying_with_parent` wraps a child's command: the child asks the kernel for SIGKILL when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``, through util-linux's ``setpriv --pdeathsig``, which then execs the
  command: same pid), so that a harness killed with ``kill -9``, or crashed, orphans nothing. The kernel sends
  it when the *thread* that started the child ends, not the process: start children from the main thread, or
  from a thread that lives as long as they should (the fault suite's supervisor thread, which ends only when
  the run stops its `cdc run`). Not a ``preexec_fn``: with one, Python runs the process's at-fork hooks in
  the child (OpenTelemetry's SDK registers some), and a hook that takes a lock another thread held at the
  fork waits for ever, before the exec (seen: a test that started `cdc run` after the tracing tests hung).
- :func:`die_with_parent_now` does the same from inside a child that Python started (a
  ``multiprocessing`` process), as its first step.
- :func:`watchdog` for what is not a child of the harness (a stack's daemons, started by `stack/stack.sh`):
  a small process that runs a clean-up command (``stack.sh down``) when the harness dies, unless the harness
  ended it first (:meth:`Watchdog.disarm`).
- :func:`crash_dumps` for a harness's own process: ``faulthandler`` on, and ``PYTHONFAULTHANDLER=1`` in the
  environment that every Python child inherits.

Linux only (prctl); elsewhere the helpers do nothing.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_prctl = _libc.prctl if _libc is not None else None
SETPRIV = shutil.which("setpriv") or "setpriv"


def _ask_for_kill(parent: int) -> None:
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: nobody will send the signal
        os._exit(1)


def dying_with_parent(command: Sequence[str]) -> list[str]:
    """``command``, run so that the child is killed when this process (the thread that starts it) dies: for
    ``subprocess.Popen`` / ``subprocess.run``. ``setpriv`` is util-linux's, on every Linux machine."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [SETPRIV, "--pdeathsig", "KILL", "--", *command]


def die_with_parent_now(parent: int) -> None:
    """From inside a child started by Python (multiprocessing): be killed when ``parent`` (the pid of the
    process that started this one, passed by it) dies."""
    _ask_for_kill(parent)


def crash_dumps() -> None:
    """faulthandler on (stderr, every thread), here and in every Python child started from now on."""
    faulthandler.enable(all_threads=True)
    os.environ["PYTHONFAULTHANDLER"] = "1"


class Watchdog:
    """``python -m tests.children <parent pid> <command...>``, started by :func:`watchdog`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def disarm(self) -> None:
        """The harness ends normally (and cleaned up, or keeps what it started on purpose)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def watchdog(command: list[str], env: dict[str, str] | None = None) -> Watchdog:
    """Run ``command`` (in ``env``) when this process dies, however it dies, unless disarmed before. Returns
    once the watchdog is armed."""
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "tests.children", str(os.getpid()), *command]
    proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout:
        armed = proc.stdout.readline()
    if armed.strip() != b"armed":
        raise RuntimeError(f"the watchdog did not start (exit {proc.wait(10)})")
    return Watchdog(proc)


def _watch(parent: int, command: list[str]) -> int:
    """The watchdog's process: wait for SIGTERM, which the kernel sends when ``parent`` dies, then run
    ``command``. The handler is in place before the request, and a parent gone already is seen."""

    def clean_up(*_: object) -> None:
        subprocess.run(command, stdin=subprocess.DEVNULL, check=False, timeout=600)
        os._exit(0)

    signal.signal(signal.SIGTERM, clean_up)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the harness's group is the harness's to handle
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        clean_up()
    os.write(1, b"armed\n")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the pipe closed: the harness reads no more
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), sys.argv[2:]))
