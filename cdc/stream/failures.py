"""A delivery that failed: what it means, and the one exception the pipeline raises for it.

Owns the judgement of a failure (the tracker's first failed delivery, the refused records, a producer that
stopped): a right Kafka denies ends the run (AccessDeniedError, never a record's fault); records Kafka
refused are the events' fault (DeliveryRefusedError, which the pipeline answers with a replay that finds
the culprit); anything else ends the run, or in exactly-once mode aborts the Kafka transaction, without
confirming past it. Reads the sink and the acknowledgements it is handed; changes nothing but the sink's
queue (purged: what it still holds would land behind the failed record).
"""

from __future__ import annotations

import time
from typing import NoReturn

from cdc.config import Settings
from cdc.errors import DeliveryError, DeliveryRefusedError
from cdc.stream.access import authorization_refusal
from cdc.stream.checkpoint import Acks
from cdc.stream.refusals import GAPLESS_STOP, REFUSAL_CODES, error_code, error_text
from cdc.stream.sink import KafkaSink

RIGHTS_PROBE_TIMEOUT = 5.0  # seconds: asking Kafka for the pipeline's rights after an unexplained failure
PURGED = frozenset(
    {-152, -151}
)  # librdkafka's _PURGE_QUEUE, _PURGE_INFLIGHT: what an aborted transaction held
# What a producer that stopped on a refused batch reports for the records it held: no cause of its own.
CONSEQUENCES = REFUSAL_CODES | PURGED | {GAPLESS_STOP}


class DeliveryFailures:
    """``check()`` once a loop turn (and in every wait): raises when a delivery failed."""

    def __init__(self, settings: Settings, sink: KafkaSink, acks: Acks) -> None:
        self._settings = settings
        self._sink = sink
        self._acks = acks
        self.count = 0  # failures seen (cdc_delivery_errors)

    def pending(self) -> bool:
        return self._acks.tracker.failure is not None or self._sink.fatal_error is not None

    def check(self) -> None:
        if self._acks.tracker.failure is not None or self._sink.fatal_error is not None:
            self.fail()

    def fail(self) -> NoReturn:
        """Kafka failed a delivery, or the producer stopped: nothing more is produced. A refusal of records
        (too large, invalid) is the events' fault: DeliveryRefusedError, which the pipeline answers with a
        replay. Any other failure ends the run without confirming past it."""
        sink, tracker = self._sink, self._acks.tracker
        if sink.fatal_error is None:
            sink.purge_queue()  # its poll may be the one that learns the producer stopped
        if sink.fatal_error is not None:
            # A stopped producer fails what it held at once: read those reports, to know every refusal.
            deadline = time.monotonic() + 5.0
            while sink.queue_depth() and time.monotonic() < deadline:
                sink.poll(0.1)
        self.count += 1
        failure = tracker.failure
        lsn = failure.commit_lsn if failure is not None else tracker.confirmed_lsn
        fatal = sink.fatal_error
        # A right Kafka denies is no record's fault: never replayed record by record, never dead-lettered.
        errors = [e for e in (fatal, failure and failure.error, *(e for _, e in tracker.refused)) if e]
        denied = authorization_refusal(self._settings, errors, lsn=lsn)
        if denied is not None:
            raise denied
        if failure is not None and not tracker.refused and error_code(failure.error) in PURGED:
            # Inside a Kafka transaction a denied Write reaches the records only as "purged": ask Kafka
            # what the pipeline may do with the topics it writes to, before calling it anything else.
            rights = dict.fromkeys(sink.produced_topics, ("Write",))
            sink.check_rights(rights, min(RIGHTS_PROBE_TIMEOUT, self._settings.startup_timeout))
        # A first failure of another kind (a request timed out on a silent connection) is the cause: the
        # purge above, of a batch already cut for the broker, stops an idempotent producer on the gapless
        # guarantee, and that stop is no refusal to replay.
        caused = failure is not None and error_code(failure.error) not in CONSEQUENCES
        if tracker.refused or (error_code(fatal) == GAPLESS_STOP and not caused):
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
