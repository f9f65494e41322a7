"""The stream's life: one explicit state, its legal transitions, and the clocks the probes read.

Owns what "are we streaming", "since when", "are we stopping, and by when" mean. Every reader agrees by
construction: ``/readyz`` and ``/healthz`` (:mod:`cdc.stream.health`), the ``cdc_pipeline_state`` gauge, the
logs (each transition is logged once, a recovery with its downtime, as supabase/etl does) and the shutdown.

```
            ┌──────────── Standby(since) ◀──┐ the slot is another process's (on_slot_active = wait)
            ▼                               │
 Starting ──────▶ Streaming(since) ◀──▶ Waiting(on, since)      Kafka's queue, a topic, the registry
   │                 │    ▲
   │                 ▼    │
   └──────▶ Reconnecting(attempt, since, cause)                 PostgreSQL lost, a replay, an abort
   any of them ──▶ Draining(deadline) ──▶ Stopped(reason, exit code)
```

A stop request (SIGTERM) may come from a signal handler at any moment: it only sets :attr:`Life.stopping`
and the time; the stream's thread moves to Draining when it sees it. Nothing here does I/O but logging.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("cdc.pipeline")


@dataclass(frozen=True, slots=True)
class Starting:
    since: float
    name = "starting"


@dataclass(frozen=True, slots=True)
class Standby:
    """Waiting for the slot that another process streams from (``on_slot_active = "wait"``)."""

    since: float
    name = "standby"


@dataclass(frozen=True, slots=True)
class Streaming:
    since: float
    name = "streaming"


@dataclass(frozen=True, slots=True)
class Waiting:
    """Streaming, but held by Kafka's full queue, a topic not there yet, or the schema registry."""

    on: str
    since: float
    name = "waiting"


@dataclass(frozen=True, slots=True)
class Reconnecting:
    attempt: int
    since: float
    cause: str
    name = "reconnecting"


@dataclass(frozen=True, slots=True)
class Draining:
    """Stopping: Kafka gets until ``deadline`` (monotonic) for what is in flight, then the slot is
    confirmed and the connections closed."""

    deadline: float
    name = "draining"


@dataclass(frozen=True, slots=True)
class Stopped:
    reason: str
    exit_code: int
    name = "stopped"


State = Starting | Standby | Streaming | Waiting | Reconnecting | Draining | Stopped
STATES = (Starting, Standby, Streaming, Waiting, Reconnecting, Draining, Stopped)

# (from, to) that may happen; anything else is a bug, refused loudly rather than reported wrongly.
TRANSITIONS: dict[type, frozenset[type]] = {
    Starting: frozenset({Standby, Streaming, Reconnecting, Draining, Stopped}),
    Standby: frozenset({Streaming, Reconnecting, Draining, Stopped}),
    Streaming: frozenset({Waiting, Reconnecting, Draining, Stopped}),
    Waiting: frozenset({Streaming, Reconnecting, Draining, Stopped}),
    Reconnecting: frozenset({Streaming, Reconnecting, Draining, Stopped}),
    Draining: frozenset({Stopped}),
    Stopped: frozenset(),
}


class IllegalTransition(Exception):
    """Internal: a transition the table does not allow (a bug in the pipeline, never the input's fault)."""


class Life:
    """The pipeline's one state object. Written by the stream's thread; read from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self.state: State = Starting(now)
        self.stopping = False  # a stop was requested (read once per loop turn: an attribute, not a call)
        self.stop_at: float | None = None
        self.turned_at = now  # when the stream's loop, or a wait of it, last turned
        self.acked_at = now  # when Kafka last acknowledged something
        self.data_at = now  # when the stream last carried a change
        self.caught_up_at = now  # when a read last emptied what the server had sent
        self._acked_seen = 0
        self._down_since: float | None = None  # when streaming last stopped, for the downtime on recovery

    @property
    def name(self) -> str:
        return self.state.name

    def to(self, new: State) -> None:
        """Move to ``new``, logging the transition once (a recovery with the time it took)."""
        old = self.state
        if type(new) not in TRANSITIONS[type(old)]:
            raise IllegalTransition(f"{old.name} -> {new.name}")
        self.state = new
        if isinstance(new, Streaming):
            if self._down_since is not None:
                log.info("state: streaming again after %.1f s (%s)", new.since - self._down_since, old.name)
            else:
                log.info("state: streaming")
            self._down_since = None
        elif isinstance(new, Waiting):
            log.info("state: waiting on %s", new.on)
        elif isinstance(new, Reconnecting):
            if self._down_since is None:
                self._down_since = new.since
            log.info("state: reconnecting (attempt %d): %s", new.attempt, new.cause)
        elif isinstance(new, Standby):
            log.info("state: standby, waiting for the slot")
        elif isinstance(new, Draining):
            log.info("state: draining (up to %.1f s)", max(0.0, new.deadline - self._clock()))
        elif isinstance(new, Stopped):
            log.info("state: stopped (%s, exit code %d)", new.reason, new.exit_code)

    def back_to_streaming(self) -> None:
        """A wait ended: streaming again (unless a stop or another state came meanwhile)."""
        if isinstance(self.state, Waiting):
            self.to(Streaming(self._clock()))

    def request_stop(self) -> None:
        """Ask for a graceful stop. Safe from a signal handler: two assignments, no logging."""
        if not self.stopping:
            self.stop_at = self._clock()
        self.stopping = True

    def stop_requested(self) -> bool:
        return self.stopping

    def turned(self, now: float, acked_events: int) -> None:
        """The loop turned: note it, and whether Kafka acknowledged anything since the last turn."""
        self.turned_at = now
        if acked_events != self._acked_seen:
            self._acked_seen = acked_events
            self.acked_at = now

    def caught_up(self, now: float) -> None:
        """A read emptied what the server had sent."""
        self.caught_up_at = now

    def carried(self, now: float) -> None:
        """The stream carried a change."""
        self.data_at = now

    def shutdown_left(self, timeout: float, reserve: float) -> float:
        """Seconds the shutdown may still wait for Kafka: ``timeout`` from the stop request (or from now),
        less ``reserve`` for confirming and closing."""
        now = self._clock()
        start = self.stop_at if self.stop_at is not None else now
        return max(0.0, start + timeout - reserve - now)

    def gauge(self) -> dict[str, int]:
        """``cdc_pipeline_state``: 1 for the current state, 0 for the others."""
        return {cls.name: int(isinstance(self.state, cls)) for cls in STATES}
