"""The pipeline's run: start, stream in sessions, come back after a loss, replay after a refusal, shut down.

A session is one replication connection to the slot, from the checks before it to its end. A lost
PostgreSQL connection (closed, or silent past ``source_silence_timeout``) is retried with exponential
backoff: the stream restarts from the slot, so nothing is skipped, after Kafka finished what it had (so the
replays come after the first copies). The walsender of our own connection that went silent is ended rather
than waited for. Records Kafka refused make it replay from the slot with a new producer
(:mod:`cdc.stream.refusals`); an aborted Kafka transaction restarts it from the checkpoint Kafka holds
(:mod:`cdc.stream.exactly_once`). SIGTERM stops reading, waits (bounded) for what is in flight, confirms what
was acknowledged and closes.

Owns nothing of the stream's but the order of these steps and the backoff between sessions; every step is a
call on a part it was given. Each step moves the stream's :class:`~cdc.stream.life.Life`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from cdc.config import Settings, describe_dsn
from cdc.errors import (
    CdcError,
    DeadLetterFloodError,
    DeliveryError,
    DeliveryRefusedError,
    HistoryDivergedError,
    SlotActiveError,
    SourceConnectionError,
    TransactionAbortedError,
    format_lsn,
)
from cdc.pg import access_refusal, database_dsn
from cdc.stream.checkpoint import Acks
from cdc.stream.confirm import Confirmer
from cdc.stream.failures import DeliveryFailures
from cdc.stream.identity import SlotIdentity
from cdc.stream.life import Draining, Life, Reconnecting, Standby, Stopped, Streaming
from cdc.stream.preflight import end_own_walsender, preflight
from cdc.stream.progress import checkpoint_table, settle_partitioner
from cdc.stream.publisher import Publisher
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import template_clashes
from cdc.stream.routes import Routes
from cdc.stream.sender import Sender
from cdc.stream.sink import KafkaSink
from cdc.stream.source import ReplicationSource
from cdc.stream.startup import start_checks
from cdc.stream.stream_loop import StreamLoop
from cdc.stream.waits import SHUTDOWN_RESERVE, Backoff, StopRequested, Waits

log = logging.getLogger("cdc.pipeline")

STANDBY_POLL = 1.0  # seconds between a standby's attempts to take the slot over


class Closing(Protocol):
    """What is closed at the end: the heartbeat's and the slot watch's connections, the position writer."""

    def close(self) -> None: ...


class Sessions:
    def __init__(
        self,
        *,
        settings: Settings,
        life: Life,
        acks: Acks,
        sink: KafkaSink,
        routes: Routes,
        publisher: Publisher,
        loop: StreamLoop,
        confirmer: Confirmer,
        refusals: RefusalLedger,
        sender: Sender,
        waits: Waits,
        failures: DeliveryFailures,
        closing: list[Closing],
        finish: Callable[[int], None],
        flood: Callable[[], DeadLetterFloodError | None],
        accept_partitioner_change: bool,
    ) -> None:
        self._settings = settings
        self._life = life
        self._acks = acks
        self._sink = sink
        self._routes = routes
        self._publisher = publisher
        self._loop = loop
        self._confirmer = confirmer
        self._refusals = refusals
        self._sender = sender
        self._waits = waits
        self._failures = failures
        self._closing = closing  # the heartbeat's and the slot watch's connections
        self._finish = finish  # with the position confirmed last: the saved position, the closing lines
        self._flood = flood
        self._accept_partitioner_change = accept_partitioner_change
        self._backoff = Backoff.of(settings)
        self._last_walsender: int | None = None  # the walsender pid of the last closed source
        self._server: tuple[str, int] | None = None
        self.reconnects = 0
        self.replays = 0  # times Kafka refused records and the stream was replayed to find why

    def run(self) -> None:
        """Stream until a stop is requested; raise a CdcError when the pipeline cannot go on."""
        s, life = self._settings, self._life
        log.info(
            "starting: database %s, slot %s, publication %s, table %s, kafka %s",
            describe_dsn(s.database_url),
            s.slot,
            s.publication,
            s.table,
            s.kafka.bootstrap_servers,
        )
        for clash in template_clashes(s):
            log.warning("%s", clash)
        # One start-up budget for Kafka and PostgreSQL together: two mistakes cost one startup_timeout.
        started = time.monotonic()
        try:
            start_checks(s, self._sink, self._routes.registry, started, stopping=life.stop_requested)
        except StopRequested:
            self._shutdown(None)
            return
        except BaseException as exc:
            life.to(Stopped(type(exc).__name__, exc.exit_code if isinstance(exc, CdcError) else 1))
            raise
        outcome: BaseException | None = None
        flood = None
        try:
            self._sessions(started)
        except StopRequested:
            pass
        except BaseException as exc:
            outcome = exc
            raise
        finally:
            if outcome is None:
                flood = self._flood()
            self._shutdown(outcome if outcome is not None else flood)
        if flood is not None:  # stopped in order, as at SIGTERM: now the exit code and the line say why
            flood.lsn = self._confirmer.confirmable()
            raise flood

    def _sessions(self, started: float) -> None:
        s, life, backoff = self._settings, self._life, self._backoff
        first = True
        while not life.stopping:
            try:
                self._session(first)
                return
            except DeliveryRefusedError as exc:
                self._replay_after_refusal(exc)
            except TransactionAbortedError as exc:
                self._restart_from_checkpoint(exc)
            except DeliveryError as exc:
                # Not a refusal: at-least-once ends the run; exactly-once aborts the Kafka transaction.
                try:
                    self._publisher.failed(exc)
                except TransactionAbortedError as aborted:
                    self._restart_from_checkpoint(aborted)
            except HistoryDivergedError as exc:
                # Nothing past the slot's position was confirmed: the next session reads it all again.
                log.warning("exactly-once: %s", exc)
                self._close_source()
                self._reconnecting("the checkpoint is not of this server's history")
            except SlotActiveError as exc:
                if first and s.on_slot_active == "wait":
                    # A standby: the slot admits one walsender, so waiting on it is the whole protocol.
                    if not isinstance(life.state, Standby):
                        log.warning("%s; waiting to take over (on_slot_active = wait)", exc)
                        life.to(Standby(time.monotonic()))
                    self._waits.sleep(STANDBY_POLL)
                    continue
                if first:
                    # Another pipeline streams from it (a refusal), or one just killed left its walsender:
                    # ended once silent past source_silence_timeout, and waited for within startup_timeout.
                    if time.monotonic() - started >= s.startup_timeout:
                        raise
                    log.warning(
                        "%s; the start waits for it to be released or to go silent (source_silence_timeout "
                        "= %g s), up to startup_timeout = %g s",
                        exc,
                        s.source_silence_timeout,
                        s.startup_timeout,
                    )
                    self._waits.sleep(STANDBY_POLL)
                    continue
                if not self._end_own_walsender(exc):
                    self._reconnect_later(exc)
            except SourceConnectionError as exc:
                # A slot still held by our own dead walsender is transient after a lost connection. At the
                # first start, a database that is restarting or being promoted ("not yet accepting
                # connections") is waited for as Kafka is, within startup_timeout; one that still does not
                # answer then is a refusal, and a supervisor's restart makes it seen.
                if first and self._confirmer.source is None:
                    denied = access_refusal(exc)
                    if denied is not None:
                        raise denied from exc  # waiting would not change the setting
                    if time.monotonic() - started >= s.startup_timeout:
                        raise
                    delay = backoff.next_delay()
                    log.warning(
                        "PostgreSQL: %s; the start waits for it (attempt %d, next in %.1f s, up to "
                        "startup_timeout = %g s)",
                        exc,
                        backoff.attempt,
                        delay,
                        s.startup_timeout,
                    )
                    self._waits.sleep(delay)
                    continue
                self._reconnect_later(exc)
            first = False

    def _session(self, first: bool) -> None:
        self._failures.check()  # seen while reconnecting: must not be forgotten with the old tracker
        s, acks = self._settings, self._acks
        info = preflight(
            database_dsn(s),
            slot=s.slot,
            publication=s.publication,
            table=(s.table.schema, s.table.name),
            check_failover=first,
            checkpoint_table=checkpoint_table(s),
            timeout=s.query_timeout,
            silence=s.source_silence_timeout,
        )
        if first:
            settle_partitioner(s, accept_change=self._accept_partitioner_change)
        self._loop.reset(server_version=info.server_version)
        if first and info.server_version < 140000:
            log.warning(
                "PostgreSQL %d: pgoutput cannot carry logical messages before 14, so events emitted with "
                "pg_logical_emit_message are not read; write them as outbox rows (outbox_emit). "
                "Heartbeats are followed by keepalive",
                info.server_version // 10000,
            )
        source = ReplicationSource(
            database_dsn(s), slot=s.slot, publication=s.publication, silence=s.source_silence_timeout
        )
        source.start()
        self._confirmer.attach(source)
        server = source.identity
        assert server is not None  # start() asked
        # The slot's own position, never what was acknowledged in an earlier session: a server restored from
        # a disk snapshot keeps its system identifier and timeline, and its slot is back where the snapshot
        # left it. Confirming what the lost history acknowledged would pass its new transactions unsent.
        acks.restart(info.confirmed_flush_lsn)
        slot = SlotIdentity(server.system_id, s.slot, info.created_lsn)
        self._publisher.start(server, slot, first=first, confirmed=info.confirmed_flush_lsn)
        self._backoff.reset()
        log.info(
            "slot %s: resuming after confirmed LSN %s%s",
            s.slot,
            format_lsn(info.confirmed_flush_lsn),
            "" if first else " (reconnected)",
        )
        self._life.to(Streaming(time.monotonic()))
        self._loop.run(source)

    def _reconnecting(self, cause: str) -> float:
        """Into Reconnecting; the next backoff delay."""
        delay = self._backoff.next_delay()
        if not self._life.stopping:
            self._life.to(Reconnecting(self._backoff.attempt, time.monotonic(), cause))
        return delay

    def _replay_after_refusal(self, exc: DeliveryRefusedError) -> None:
        """Kafka refused records and the producer stopped before anything went behind them: replay from
        the slot with a new producer; the refused records are produced alone, and the one Kafka refuses
        alone is dead-lettered (cdc.stream.refusals)."""
        self._refusals.note(
            exc.refused,
            alone=self._sender.alone,
            at=self._acks.tracker.confirmed_lsn,
            until=self._loop.received,
        )
        self._sender.alone = None
        self._close_source()
        self._publisher.drop()  # exactly-once: its records are refused or behind a refusal
        # The failed deliveries are known now: what the replay meets is tracked afresh, from what may be
        # confirmed (with exactly-once, what committed Kafka transactions cover).
        self._acks.restart(self._confirmer.confirmable())
        self._sink.reset()
        self._routes.forget()  # topic limits are read again
        self.replays += 1
        log.warning(
            "%s; replaying from the slot and producing the refused records one at a time (replay %d)",
            exc,
            self.replays,
        )
        if not self._life.stopping:
            self._life.to(Reconnecting(self.replays, time.monotonic(), "replay after Kafka refused records"))

    def _reconnect_later(self, exc: Exception) -> None:
        """The connection to PostgreSQL was lost: let Kafka finish what it has, then wait before the next
        session."""
        self._close_source()
        self.reconnects += 1
        try:
            self._publisher.end(whole=not self._loop.in_transaction)
        except TransactionAbortedError as aborted:
            # Aborted: the publisher reads the checkpoint back, and the next session starts from it.
            log.warning("the open Kafka transaction was aborted on losing PostgreSQL: %s", aborted)
        self._drain_after_loss()
        delay = self._reconnecting(str(exc))
        log.warning("PostgreSQL: %s; reconnecting in %.1f s (attempt %d)", exc, delay, self._backoff.attempt)
        self._waits.sleep(delay)

    def _restart_from_checkpoint(self, exc: TransactionAbortedError) -> None:
        self._close_source()
        # A commit taken for failed may have gone through: a new producer's init_transactions() makes the
        # coordinator finish it. What Kafka holds decides what is published again, not what we believe.
        delay = self._reconnecting(str(exc))
        log.warning(
            "%s; aborted it, restarting in %.1f s from the checkpoint that Kafka holds then (%s before)",
            exc,
            delay,
            self._publisher.describe(),
        )
        if self._sink.fatal_error is not None:
            self._sink.reset()
        self._waits.sleep(delay)

    def _end_own_walsender(self, exc: SlotActiveError) -> bool:
        """The slot is held by the walsender of our own last connection, which went silent: end it rather
        than wait for wal_sender_timeout. True when the next session may start at once."""
        ours = self._last_walsender
        if ours is None or exc.pid != ours:
            return False
        self._last_walsender = None
        return end_own_walsender(self._settings, ours)

    def _drain_after_loss(self) -> None:
        """After losing the source: let Kafka finish what it has, so the restarted stream's replays come
        after, not interleaved with, the first copies (per-aggregate order across reconnects)."""
        left = self._sink.flush(self._settings.shutdown_timeout)
        if left:
            raise DeliveryError(
                f"{left} events still unacknowledged {self._settings.shutdown_timeout:g} s after "
                "losing PostgreSQL; stopping",
                lsn=self._acks.tracker.confirmed_lsn,
            )

    def _close_source(self) -> None:
        source = self._confirmer.detach()
        if source is not None:
            self._last_walsender = source.backend_pid
            source.close()

    def _shutdown(self, outcome: BaseException | None) -> None:
        """Stop reading, wait (bounded) for what is in flight, confirm what was acknowledged, close; the
        Kafka clients last, whatever happened before (none may outlive the run: KafkaSink.close)."""
        try:
            self._wind_down(outcome)
        finally:
            self._sink.close()

    def _wind_down(self, outcome: BaseException | None) -> None:
        s, life, sink, confirmer = self._settings, self._life, self._sink, self._confirmer
        timeout = s.shutdown_timeout
        life.to(Draining(time.monotonic() + self._waits.shutdown_left()))
        try:
            self._publisher.end(whole=not self._loop.in_transaction)
        except (DeliveryError, StopRequested) as exc:
            reason = str(exc) or f"shutdown_timeout ({timeout:g} s) ran out"
            log.warning("the open Kafka transaction was not committed: %s", reason)
        if self._acks.tracker.failure is not None:
            sink.purge_queue()  # what it still holds would land behind the failed record
        left = sink.flush(self._waits.shutdown_left())
        if left:
            log.warning(
                "%d events not acknowledged within shutdown_timeout (%g s); they will be published "
                "again after a restart",
                left,
                timeout,
            )
        for part in self._closing:
            part.close()
        if self._routes.registry is not None:
            self._routes.registry.close()
        if confirmer.source is not None:
            try:
                confirmer.send()
            except SourceConnectionError as exc:
                log.warning(
                    "could not confirm %s at shutdown (%s): events after the slot's position will be "
                    "published again",
                    format_lsn(confirmer.confirmable()),
                    exc,
                )
            source = confirmer.detach()
            assert source is not None
            source.finish(timeout=min(2.0, SHUTDOWN_RESERVE / 2))
        self._finish(confirmer.sent)
        reason, code = "stopped on request", 0
        if outcome is not None:
            reason = type(outcome).__name__
            code = outcome.exit_code if isinstance(outcome, CdcError) else 1
        life.to(Stopped(reason, code))
