"""systemd's notifications (sd_notify(3)) for `cdc run` under ``Type=notify``, without libsystemd: datagrams
of ``KEY=VALUE`` lines to the unix socket that ``$NOTIFY_SOCKET`` names (``@name``: the abstract namespace).

- ``READY=1`` once the pipeline streams from its slot: the start's waits (Kafka, PostgreSQL, the slot held
  by another process) are over.
- ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC`` (systemd's ``WatchdogSec=``) while the stream's loop turns.
  The answer is the one ``/healthz`` gives (:meth:`cdc.stream.health.Health.alive`: the loop, or a wait of
  it, turned within ``liveness_timeout``), asked from this module's thread: the hot loop is not touched, and
  systemd and a Kubernetes liveness probe judge the same thing. A loop that stops turning is killed
  (``WatchdogSignal=``, SIGABRT) and restarted by systemd ``liveness_timeout`` plus at most ``WatchdogSec``
  after its last turn.
- ``STOPPING=1`` at SIGTERM; ``STATUS=`` says what it waits for (``systemctl status`` shows it).

Without ``$NOTIFY_SOCKET`` (not under systemd, or ``Type=exec``) nothing is sent and no thread runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["Notifier"]

log = logging.getLogger("cdc.notify")

TICK = 1.0  # seconds between two looks at the pipeline, at most


class Probe(Protocol):
    """What the notifier asks of the pipeline (:class:`cdc.stream.health.Health` answers it)."""

    def alive(self) -> str | None: ...

    def seconds_since_server_message(self) -> float | None: ...


def _address(path: str) -> str:
    return "\0" + path[1:] if path.startswith("@") else path


class Notifier:
    def __init__(
        self,
        probe: Probe,
        socket_path: str,
        watchdog: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``watchdog``: systemd's WatchdogSec in seconds, None when it is off."""
        self._probe = probe
        self._address = _address(socket_path)
        self.watchdog = watchdog
        self._clock = clock
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.ready = False
        self._last_watchdog = -float("inf")
        self._status = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-notify", daemon=True)

    @classmethod
    def from_environment(cls, probe: Probe, environ: Mapping[str, str] = os.environ) -> Notifier | None:
        """A notifier when systemd asked for notifications, else None. The watchdog is ours only when
        ``$WATCHDOG_PID`` is unset or this process's."""
        path = environ.get("NOTIFY_SOCKET", "")
        if not path:
            return None
        watchdog = None
        usec = environ.get("WATCHDOG_USEC", "")
        if (
            usec.isdigit()
            and int(usec) > 0
            and environ.get("WATCHDOG_PID", str(os.getpid())) == str(os.getpid())
        ):
            watchdog = int(usec) / 1e6
        return cls(probe, path, watchdog)

    def send(self, *lines: str) -> bool:
        """One datagram; False (and a DEBUG line) when systemd is not listening."""
        try:
            self._socket.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            log.debug("sd_notify %s: %s", lines, exc)
            return False
        return True

    def beat(self) -> None:
        """Look at the pipeline once: READY when it first streams, WATCHDOG when one is due and it lives."""
        if not self.ready and self._probe.seconds_since_server_message() is not None:
            self.ready = self.send("READY=1", "STATUS=streaming")
            self._status = "streaming"
        if self.watchdog is None:
            return
        now = self._clock()
        if now - self._last_watchdog < self.watchdog / 2:
            return
        stuck = self._probe.alive()
        if stuck is None:
            self.send("WATCHDOG=1")
            self._last_watchdog = now
        elif stuck != self._status:  # no watchdog: systemd ends the process once WatchdogSec has passed
            self.send(f"STATUS={stuck}")
            self._status = stuck

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def _run(self) -> None:
        interval = TICK if self.watchdog is None else min(TICK, self.watchdog / 4)
        while not self._stop.wait(interval):
            self.beat()

    def stopping(self) -> None:
        """SIGTERM: the stop has begun (safe from a signal handler: one datagram)."""
        self.send("STOPPING=1", "STATUS=stopping: waiting for in-flight acknowledgements")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(TICK + 1)
        self._socket.close()
