"""Confirming to the slot: the standby status updates, and the keep-alive that every wait calls.

Owns the replication connection the updates go to (attached by the session, detached when it goes) and the
last position sent. What may be confirmed is the acknowledged watermark as the publisher bounds it
(``confirmable``); the position noted for `cdc recover` (:class:`cdc.stream.progress.PositionWriter`) and
the refusal ledger's settling follow each update. Gets those, the :class:`~cdc.stream.life.Life` (a stop
request ends a wait), ``check`` (a failed delivery ends a wait) and ``received`` (how far the stream read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc.errors import format_lsn
from cdc.stream.checkpoint import Acks
from cdc.stream.life import Life
from cdc.stream.progress import PositionWriter
from cdc.stream.refusals import RefusalLedger
from cdc.stream.source import ReplicationSource
from cdc.stream.waits import STATUS_MIN_INTERVAL, StopRequested

log = logging.getLogger("cdc.pipeline")


class Confirmer:
    def __init__(
        self,
        acks: Acks,
        life: Life,
        position: PositionWriter,
        refusals: RefusalLedger,
        *,
        status_interval: float,
        confirmable: Callable[[int], int],
        check: Callable[[], None],
        received: Callable[[], int],
    ) -> None:
        self._acks = acks
        self._life = life
        self._position = position
        self._refusals = refusals
        self._status_interval = status_interval
        self._bound = confirmable
        self._check = check
        self._received = received
        self.source: ReplicationSource | None = None  # the session's connection, while there is one
        self.sent = -1  # the last position confirmed to it

    def attach(self, source: ReplicationSource) -> None:
        self.source, self.sent = source, -1

    def detach(self) -> ReplicationSource | None:
        source, self.source = self.source, None
        return source

    def confirmable(self) -> int:
        """What may be confirmed to the slot now."""
        return self._bound(self._acks.tracker.confirmed_lsn)

    def send(self) -> None:
        source = self.source
        if source is None:
            return
        confirmed = self.confirmable()
        tracker = self._acks.tracker
        source.send_status(max(self._received(), confirmed), confirmed)
        self._position.offer(time.monotonic(), confirmed, tracker.last_outbox)
        if self._refusals.active:
            self._refusals.settled(confirmed)
        if confirmed != self.sent:
            log.debug("confirmed %s", format_lsn(confirmed))
        self.sent = confirmed

    def due(self, now: float) -> None:
        """Once a loop turn: whenever the watermark moved, but not more often than STATUS_MIN_INTERVAL (at
        tens of thousands of events a second it moves with every batch), and at least every
        status_interval so the server does not take us for dead."""
        source = self.source
        if source is None:
            return
        since = now - source.last_status_at
        if since >= self._status_interval or (
            self.confirmable() != self.sent and since >= STATUS_MIN_INTERVAL
        ):
            self.send()

    def keep_alive(self) -> None:
        """Called while waiting on Kafka (a full producer queue, a missing topic, the registry): keep the
        status updates flowing, and confirm a moved watermark as often as the stream loop does. A full
        queue is where acknowledgements arrive fastest; left unconfirmed, a kill -9 would publish them
        again, beyond the in-flight window. A failed delivery ends the wait: nothing is produced after it."""
        life = self._life
        now = time.monotonic()
        life.turned(now, self._acks.tracker.acked_events)
        if life.stopping:
            raise StopRequested
        self._check()
        source = self.source
        if source is None:
            return
        since = now - source.last_status_at
        if since >= min(1.0, self._status_interval) or (
            self.confirmable() != self.sent and since >= STATUS_MIN_INTERVAL
        ):
            self.send()
