"""Is the pipeline well? What ``/healthz`` (its loop turns) and ``/readyz`` (it streams, PostgreSQL speaks,
Kafka answers and acknowledges) ask of it, from the metrics server's thread.

Owns nothing: it reads the stream's :class:`~cdc.stream.life.Life` (the state, when the loop last turned,
when Kafka last acknowledged), the session's connection (through the confirmer that holds it), the sink and
the dead-letter path. Reading numbers and references the stream's thread writes is safe from another thread.
"""

from __future__ import annotations

import time

from cdc.config import Settings
from cdc.stream.confirm import Confirmer
from cdc.stream.life import Draining, Life, Reconnecting, Standby, Starting, Stopped
from cdc.stream.sink import KafkaSink


class Health:
    def __init__(self, settings: Settings, life: Life, sink: KafkaSink, confirmer: Confirmer) -> None:
        self._settings = settings
        self._life = life
        self._sink = sink
        self._confirmer = confirmer

    def not_ready(self) -> list[str]:
        """Why the pipeline is not ready (empty when it is): for /readyz."""
        reasons = []
        now = time.monotonic()
        state = self._life.state
        source = self._confirmer.source
        if isinstance(state, Standby):
            reasons.append(
                "not streaming from PostgreSQL: a standby, another process streams from the slot "
                "(on_slot_active = wait)"
            )
        elif isinstance(state, Reconnecting):
            reasons.append(
                f"not streaming from PostgreSQL: reconnecting (attempt {state.attempt}): {state.cause}"
            )
        elif isinstance(state, Starting | Draining | Stopped) or source is None:
            reasons.append(f"not streaming from PostgreSQL ({state.name})")
        elif (silent := now - source.last_message_at) > source.silence:
            reasons.append(f"nothing from PostgreSQL for {silent:.0f} s (source_silence_timeout)")
        if not self._sink.broker_reachable():
            reasons.append("Kafka does not answer")
        waiting = self._sink.queue_depth()
        timeout = self._settings.delivery_timeout
        acked_at = self._life.acked_at
        if waiting and now - acked_at > timeout:
            reasons.append(
                f"{waiting} events wait for Kafka's acknowledgement, none for {now - acked_at:.0f} s "
                f"(delivery_timeout = {timeout:g} s)"
            )
        return reasons

    def alive(self) -> str | None:
        """Why the pipeline is stuck (None when its loop turns): for /healthz."""
        still = time.monotonic() - self._life.turned_at
        if still > self._settings.liveness_timeout:
            return f"the stream's loop has not turned for {still:.0f} s (liveness_timeout)"
        return None

    def seconds_since_server_message(self) -> float | None:
        """How long ago PostgreSQL's replication stream last said anything (None: not streaming)."""
        source = self._confirmer.source
        return None if source is None else time.monotonic() - source.last_message_at
