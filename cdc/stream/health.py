"""Is the pipeline well? What ``/healthz`` (its loop turns) and ``/readyz`` (it streams, PostgreSQL speaks,
Kafka answers and acknowledges) ask of it, from the metrics server's thread.

Read-only, and safe from another thread: it reads numbers and references the stream's thread writes.
"""

from __future__ import annotations

import time
from collections import deque

from cdc.config import Settings
from cdc.stream.sink import KafkaSink
from cdc.stream.source import ReplicationSource


class Health:
    """The pipeline's answers to the probes (a mixin of :class:`cdc.stream.lifecycle.Lifecycle`)."""

    settings: Settings
    sink: KafkaSink
    _source: ReplicationSource | None
    _dead_letter_times: deque[float] | None
    turned_at: float  # when the stream's loop (or a wait of it) last turned (monotonic)
    last_ack_at: float  # when Kafka last acknowledged something (monotonic)

    def dead_letters_in_window(self) -> int:
        """The poison-flood brake's count: dead letters within the last dead_letter_window (0 when off)."""
        times = self._dead_letter_times
        if times is None:
            return 0
        since = time.monotonic() - self.settings.dead_letter_window
        return sum(1 for t in tuple(times) if t >= since)  # a copy: the stream's thread appends meanwhile

    def not_ready(self) -> list[str]:
        """Why the pipeline is not ready (empty when it is): for /readyz. Read from another thread."""
        reasons = []
        now = time.monotonic()
        source = self._source
        if source is None:
            reasons.append("not streaming from PostgreSQL")
        elif (silent := now - source.last_message_at) > source.silence:
            reasons.append(f"nothing from PostgreSQL for {silent:.0f} s (source_silence_timeout)")
        if not self.sink.broker_reachable():
            reasons.append("Kafka does not answer")
        waiting = self.sink.queue_depth()
        timeout = self.settings.delivery_timeout
        if waiting and now - self.last_ack_at > timeout:
            reasons.append(
                f"{waiting} events wait for Kafka's acknowledgement, none for {now - self.last_ack_at:.0f} s "
                f"(delivery_timeout = {timeout:g} s)"
            )
        return reasons

    def alive(self) -> str | None:
        """Why the pipeline is stuck (None when its loop turns): for /healthz. Read from another thread."""
        still = time.monotonic() - self.turned_at
        if still > self.settings.liveness_timeout:
            return f"the stream's loop has not turned for {still:.0f} s (liveness_timeout)"
        return None

    def seconds_since_server_message(self) -> float | None:
        """How long ago PostgreSQL's replication stream last said anything (None: not streaming)."""
        source = self._source
        return None if source is None else time.monotonic() - source.last_message_at
