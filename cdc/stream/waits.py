"""Waiting without losing the slot: backoff, sleeping with the stream kept alive, retrying what an
infrastructure problem holds up, and waiting for Kafka's queue to empty.

Owns no state of the pipeline's: it is handed the sink (to serve Kafka's callbacks while it waits), the
stream's :class:`~cdc.stream.life.Life` (a stop request ends every wait; a long wait is the Waiting state),
and two callables: ``keep_alive`` (status updates to PostgreSQL, and the check for a failed delivery, which
ends every wait at once so that nothing is produced after it) and ``check`` (that failure check alone).
psycopg 3 keeps its protocol generators apart from the code that waits; this module is the waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from cdc.config import Settings
from cdc.errors import CdcError
from cdc.stream.life import Life, Waiting
from cdc.stream.sink import KafkaSink

log = logging.getLogger("cdc.pipeline")

STATUS_MIN_INTERVAL = 0.1  # seconds between status updates that only report a moved watermark
SHUTDOWN_RESERVE = 5.0  # seconds of shutdown_timeout kept for confirming and closing after Kafka's waits
_T = TypeVar("_T")


class StopRequested(Exception):
    """Internal: unwinds a wait (a full producer queue, a missing topic) when a stop was requested."""


class Backoff:
    """Exponential backoff: initial delay, multiplier, maximum."""

    def __init__(self, initial: float, multiplier: float, maximum: float) -> None:
        self.initial, self.multiplier, self.maximum = initial, multiplier, maximum
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.initial * self.multiplier**self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0

    @classmethod
    def of(cls, settings: Settings) -> Backoff:
        return cls(settings.backoff_initial, settings.backoff_multiplier, settings.backoff_max)


class Waits:
    """The pipeline's waits, given what they need to keep the stream alive."""

    def __init__(
        self,
        *,
        settings: Settings,
        sink: KafkaSink,
        life: Life,
        keep_alive: Callable[[], None],
        check: Callable[[], None],
        acked_events: Callable[[], int],
    ) -> None:
        self._settings = settings
        self._sink = sink
        self._life = life
        self._keep_alive = keep_alive
        self._check = check
        self._acked_events = acked_events

    def sleep(self, seconds: float, *, keep_alive: bool = False) -> None:
        """Sleep up to ``seconds``, serving Kafka's callbacks; a stop request ends it early."""
        life, sink = self._life, self._sink
        deadline = time.monotonic() + seconds
        while not life.stopping and (left := deadline - time.monotonic()) > 0:
            life.turned(time.monotonic(), self._acked_events())
            sink.poll(min(left, 0.2))
            if keep_alive:
                self._keep_alive()

    def retrying(self, attempt: Callable[[], _T], waits_on: type[CdcError], on: str, recovered: str) -> _T:
        """``attempt()``, again and again with backoff while it raises ``waits_on`` (an infrastructure
        problem the event is not to blame for), keeping the replication connection alive meanwhile. The
        stream is Waiting (``on``) until it succeeds."""
        try:
            return attempt()
        except waits_on as exc:
            log.warning("%s; waiting, with backoff", exc)
        life = self._life
        if not life.stopping and not isinstance(life.state, Waiting):
            life.to(Waiting(on, time.monotonic()))
        backoff = Backoff.of(self._settings)
        while True:
            self.sleep(backoff.next_delay(), keep_alive=True)
            if life.stopping:
                raise StopRequested
            try:
                result = attempt()
            except waits_on as exc:
                log.warning("%s (attempt %d); waiting, with backoff", exc, backoff.attempt)
                continue
            log.info("%s; going on", recovered)
            life.back_to_streaming()
            return result

    def until_empty(self) -> None:
        """Until every record handed to the producer is acknowledged (or one failed)."""
        sink = self._sink
        while sink.queue_depth():
            sink.poll(0.05)
            self._keep_alive()
        self._check()

    def shutdown_left(self) -> float:
        """Seconds the shutdown may still wait for Kafka (shutdown_timeout from the stop request)."""
        timeout = self._settings.shutdown_timeout
        return self._life.shutdown_left(timeout, min(SHUTDOWN_RESERVE, timeout / 3))
