"""Waiting without losing the slot: backoff, keep-alive status updates, and the check for a failed delivery.

The pipeline waits on Kafka (a full producer queue), on a topic that is not there yet, on the schema
registry. While it waits, the replication connection must stay alive (status updates at least every
``status_interval``) and a watermark that moved must be confirmed as often as the stream loop would; and a
delivery that failed ends every wait at once, so that nothing is produced after it.

This is the base of the pipeline's classes (:mod:`cdc.stream.delivery`, :mod:`cdc.stream.lifecycle`,
:mod:`cdc.stream.pipeline`): it declares the state they share.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import NoReturn, TypeVar

from cdc.config import Settings
from cdc.errors import (
    CdcError,
    DeadLetterFloodError,
    DeliveryError,
    DeliveryRefusedError,
    TopicMissingError,
    format_lsn,
)
from cdc.stream.access import authorization_refusal
from cdc.stream.checkpoint import AckTracker, Transaction
from cdc.stream.progress import PositionWriter
from cdc.stream.refusals import GAPLESS_STOP, RefusalLedger, error_code, error_text
from cdc.stream.sink import Headers, KafkaSink
from cdc.stream.source import ReplicationSource
from cdc.stream.transactions import Checkpoint, KafkaTransaction

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


RIGHTS_PROBE_TIMEOUT = 5.0  # seconds: asking Kafka for the pipeline's rights after an unexplained failure
PURGED = frozenset(
    {-152, -151}
)  # librdkafka's _PURGE_QUEUE, _PURGE_INFLIGHT: what an aborted transaction held


class Waits:
    """The waits of the pipeline, and the state every part of it reads (set by ``Lifecycle.__init__``)."""

    settings: Settings
    sink: KafkaSink
    tracker: AckTracker
    refusals: RefusalLedger
    position: PositionWriter
    dead_lettered_by_reason: defaultdict[str, int]
    # The poison-flood brake (max_dead_letters): when the last dead letters were handed over (monotonic;
    # None: off), and the error that stops the run at the end of the current source transaction.
    _dead_letter_times: deque[float] | None
    _flood: DeadLetterFloodError | None
    delivery_errors: int
    _stop: bool
    _stop_at: float | None  # monotonic time of the stop request
    _source: ReplicationSource | None
    _received: int  # the highest WAL position read from the stream
    _sent_confirmed: int
    _txn: Transaction | None
    _txn_lsn: bytes
    _txn_xid: bytes
    _txn_ts_ms: int
    _alone: bytes | None  # the digest of the record produced alone, while it is
    _trace: bool
    _extra_headers: Headers
    # Exactly-once (cdc.stream.transactions): the open Kafka transaction, and the LSN that committed ones
    # cover, beyond which the slot may not be confirmed while a Kafka transaction is open.
    ktx: KafkaTransaction
    _kafka_safe_lsn: int
    _verify: Checkpoint | None  # a skip below this checkpoint is provisional (cdc.stream.exactly_once)
    _hold: int  # the slot's position, where confirming stops while the skip is provisional
    # Liveness and readiness (/healthz, /readyz): when the stream's loop (or a wait of it) last turned, and
    # when Kafka last acknowledged something (monotonic); acked_seen is the acknowledgement count then.
    turned_at: float
    last_ack_at: float
    _acked_seen: int

    def _turned(self, now: float) -> None:
        """The loop turned: note it, and whether Kafka acknowledged anything since the last turn."""
        self.turned_at = now
        acked = self.tracker.acked_events
        if acked != self._acked_seen:
            self._acked_seen = acked
            self.last_ack_at = now

    def request_stop(self) -> None:
        """Ask the pipeline to stop reading and shut down gracefully (safe to call from a signal handler).
        The shutdown's waits fit in shutdown_timeout from now, with SHUTDOWN_RESERVE left to confirm."""
        if not self._stop:
            self._stop_at = time.monotonic()
        self._stop = True

    def _shutdown_left(self) -> float:
        """Seconds the shutdown may still wait for Kafka: shutdown_timeout from the stop request (or from
        now), less what confirming and closing needs."""
        timeout = self.settings.shutdown_timeout
        start = self._stop_at if self._stop_at is not None else time.monotonic()
        return max(0.0, start + timeout - min(SHUTDOWN_RESERVE, timeout / 3) - time.monotonic())

    def _confirmable(self) -> int:
        """What may be confirmed to the slot: the acknowledged watermark, and with exactly-once delivery no
        further than the committed Kafka transactions while one is open (its records are acknowledged
        before they are committed)."""
        confirmed = self.tracker.confirmed_lsn
        if self.ktx.open and confirmed > self._kafka_safe_lsn:
            return self._kafka_safe_lsn
        if self._verify is not None and confirmed > self._hold:
            return self._hold  # a provisional skip: nothing past the slot's position until it is sure
        return confirmed

    def _ensure_topic(self, topic: str) -> None:
        self._waiting(lambda: self.sink.ensure_topic(topic), TopicMissingError, f"topic {topic} exists now")

    def _waiting(self, attempt: Callable[[], _T], waits_on: type[CdcError], recovered: str) -> _T:
        """``attempt()``, again and again with backoff while it raises ``waits_on`` (an infrastructure
        problem the event is not to blame for), keeping the replication connection alive meanwhile."""
        try:
            return attempt()
        except waits_on as exc:
            log.warning("%s; waiting, with backoff", exc)
        s = self.settings
        backoff = Backoff(s.backoff_initial, s.backoff_multiplier, s.backoff_max)
        while True:
            self._sleep(backoff.next_delay(), keep_alive=True)
            if self._stop:
                raise StopRequested
            try:
                result = attempt()
            except waits_on as exc:
                log.warning("%s (attempt %d); waiting, with backoff", exc, backoff.attempt)
                continue
            log.info("%s; going on", recovered)
            return result

    def _keep_alive(self) -> None:
        """Called while waiting on Kafka (a full producer queue, a missing topic, the registry): keep the
        status updates flowing, and confirm a moved watermark as often as the stream loop does. A full
        queue is where acknowledgements arrive fastest; left unconfirmed, a kill -9 would publish them
        again, beyond the in-flight window. A failed delivery ends the wait: nothing is produced after it."""
        self._turned(time.monotonic())
        if self._stop:
            raise StopRequested
        if self.tracker.failure is not None or self.sink.fatal_error is not None:
            self._delivery_failed()
        source = self._source
        if source is None:
            return
        since = time.monotonic() - source.last_status_at
        if since >= min(1.0, self.settings.status_interval) or (
            self._confirmable() != self._sent_confirmed and since >= STATUS_MIN_INTERVAL
        ):
            self._send_status()

    def _send_status(self) -> None:
        source = self._source
        if source is None:
            return
        confirmed = self._confirmable()
        source.send_status(max(self._received, confirmed), confirmed)
        self.position.offer(time.monotonic(), confirmed, self.tracker.last_outbox)
        if self.refusals.active:
            self.refusals.settled(confirmed)
        if confirmed != self._sent_confirmed:
            log.debug("confirmed %s", format_lsn(confirmed))
        self._sent_confirmed = confirmed

    def _sleep(self, seconds: float, keep_alive: bool = False) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and (left := deadline - time.monotonic()) > 0:
            self._turned(time.monotonic())
            self.sink.poll(min(left, 0.2))
            if keep_alive:
                self._keep_alive()

    def _wait_empty(self) -> None:
        """Until every record handed to the producer is acknowledged (or one failed)."""
        sink = self.sink
        while sink.queue_depth():
            sink.poll(0.05)
            self._keep_alive()
        if self.tracker.failure is not None or sink.fatal_error is not None:
            self._delivery_failed()

    def _delivery_failed(self) -> NoReturn:
        """Kafka failed a delivery, or the producer stopped: nothing more is produced. A refusal of records
        (too large, invalid) is the events' fault: DeliveryRefusedError, which run() answers with a replay.
        Any other failure ends the run without confirming past it."""
        sink, tracker = self.sink, self.tracker
        if sink.fatal_error is None:
            sink.purge_queue()  # its poll may be the one that learns the producer stopped
        if sink.fatal_error is not None:
            # A stopped producer fails what it held at once: read those reports, to know every refusal.
            deadline = time.monotonic() + 5.0
            while sink.queue_depth() and time.monotonic() < deadline:
                sink.poll(0.1)
        self.delivery_errors += 1
        failure = tracker.failure
        lsn = failure.commit_lsn if failure is not None else tracker.confirmed_lsn
        fatal = sink.fatal_error
        # A right Kafka denies is no record's fault: never replayed record by record, never dead-lettered.
        errors = [e for e in (fatal, failure and failure.error, *(e for _, e in tracker.refused)) if e]
        denied = authorization_refusal(self.settings, errors, lsn=lsn)
        if denied is not None:
            raise denied
        if failure is not None and not tracker.refused and error_code(failure.error) in PURGED:
            # Inside a Kafka transaction a denied Write reaches the records only as "purged": ask Kafka
            # what the pipeline may do with the topics it writes to, before calling it anything else.
            rights = dict.fromkeys(self.sink.produced_topics, ("Write",))
            self.sink.check_rights(rights, min(RIGHTS_PROBE_TIMEOUT, self.settings.startup_timeout))
        if tracker.refused or error_code(fatal) == GAPLESS_STOP:
            # Without reports (confluent-kafka can lose them to the fatal error) the replay still reads
            # the topics' limits again; the ledger stops a replay that makes no progress.
            first = tracker.refused[0][1] if tracker.refused else fatal
            raise DeliveryRefusedError(
                f"Kafka refused {len(tracker.refused)} records: {error_text(first)}",
                refused=list(tracker.refused),
                lsn=lsn,
            )
        if failure is not None:
            raise DeliveryError(
                f"Kafka refused an event of transaction {failure.xid}: "
                f"{error_text(failure.error)}; stopping without confirming past it "
                "(a restart resumes from the slot)",
                lsn=lsn,
            )
        raise DeliveryError(f"the Kafka producer failed fatally: {error_text(fatal)}", lsn=lsn)
