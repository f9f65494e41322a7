"""Losing a connection and coming back: what the pipeline does between two streaming sessions.

A lost PostgreSQL connection (closed, or silent past ``source_silence_timeout``) is retried with
exponential backoff: the stream restarts from the slot, so nothing is skipped, after Kafka finished what it
had (so the replays come after the first copies). The walsender of our own connection that went silent is
ended rather than waited for. An aborted Kafka transaction restarts the stream from the checkpoint that
Kafka holds (:mod:`cdc.stream.exactly_once`).
"""

from __future__ import annotations

import logging

import psycopg

from cdc.errors import (
    DeliveryError,
    SlotActiveError,
    SourceConnectionError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.pg import database_dsn
from cdc.stream.exactly_once import ExactlyOnce
from cdc.stream.preflight import end_walsender
from cdc.stream.waits import Backoff, StopRequested

log = logging.getLogger("cdc.pipeline")


class Reconnects(ExactlyOnce):
    """Between two sessions (a mixin of :class:`cdc.stream.lifecycle.Lifecycle`)."""

    reconnects: int
    _last_walsender: int | None  # the walsender pid of the last closed source

    def _end_own_walsender(self, exc: SlotActiveError) -> bool:
        """The slot is held by the walsender of our own last connection, which went silent (frozen by the
        network, so the server does not know it is gone): end it rather than wait for wal_sender_timeout.
        True when it was ended and the next session may start at once."""
        pid, ours = exc.pid, self._last_walsender
        if pid is None or pid != ours:
            return False
        self._last_walsender = None
        try:
            ended = end_walsender(database_dsn(self.settings), pid, self.settings.query_timeout)
        except (SourceConnectionError, psycopg.Error) as failure:
            log.warning("could not end our silent walsender (pid %d): %s", pid, failure)
            return False
        if ended:
            log.warning("ended our previous walsender (pid %d), silent since its connection froze", pid)
        return ended

    def _reconnect_later(self, exc: Exception, backoff: Backoff) -> None:
        """The connection to PostgreSQL was lost: let Kafka finish what it has, then wait before the next
        session."""
        self._close_source()
        self.reconnects += 1
        if self.ktx.open:
            try:
                self._end_kafka_transaction()
            except (TransactionAbortedError, StopRequested):
                pass  # the next session starts from the checkpoint anyway; a stop is seen by run()
        self._drain_after_loss()
        delay = backoff.next_delay()
        log.warning("PostgreSQL: %s; reconnecting in %.1f s (attempt %d)", exc, delay, backoff.attempt)
        self._sleep(delay)

    def _restart_from_checkpoint(self, exc: TransactionAbortedError, backoff: Backoff) -> None:
        self._close_source()
        # A commit taken for failed may have gone through: a new producer's init_transactions() makes the
        # coordinator finish it. What Kafka holds decides what is published again, not what we believe.
        self._checkpoint_stale = True
        delay = backoff.next_delay()
        log.warning(
            "%s; aborted it, restarting in %.1f s from the checkpoint that Kafka holds then (%s before)",
            exc,
            delay,
            format_lsn(self.checkpoint.end_lsn) if self.checkpoint else "none",
        )
        if self.sink.fatal_error is not None:
            self.sink.reset()
        self._sleep(delay)

    def _drain_after_loss(self) -> None:
        """After losing the source: let Kafka finish what it has, so the restarted stream's replays come
        after, not interleaved with, the first copies (per-aggregate order across reconnects)."""
        left = self.sink.flush(self.settings.shutdown_timeout)
        if left:
            raise DeliveryError(
                f"{left} events still unacknowledged {self.settings.shutdown_timeout:g} s after "
                "losing PostgreSQL; stopping",
                lsn=self.tracker.confirmed_lsn,
            )

    def _close_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            self._last_walsender = source.backend_pid
            source.close()
