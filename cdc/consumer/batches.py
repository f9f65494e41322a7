"""The consumer's batch loop: many records in one database transaction and one offset commit, sized to
take about ``BATCH_SECONDS``; a batch in which a handler fails is replayed record by record.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from cdc.avro.deserialize import Event
from cdc.consumer.processed import mark_many
from cdc.consumer.records import Records

log = logging.getLogger("cdc.consumer")

BATCH_SECONDS: Final = 0.25  # the time one batch (one transaction, one offset commit) aims to take


class _BatchEnded(Exception):
    """Internal: the handler raised for the index-th event of a batch."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index, self.error = index, error


class Batches(Records):
    """Batches of records, each in one transaction."""

    def _process_batch(self, records: list[Any]) -> None:
        """Records in as few transactions as possible: a commit (an fsync) per record would bound a
        service to a few hundred events/s. The first record that does not go through cleanly ends the
        batch before it and takes the per-record path (retries, dead letters, crashes) with the error it
        already raised."""
        started, i = time.monotonic(), 0
        while i < len(records) and not self._stop.is_set():
            done, failed = self._apply_batch(records[i:])
            if done:
                self._commit(*records[i : i + done])
            i += done
            if i < len(records) and not self._stop.is_set():
                event, error = failed or (None, None)
                self._process(records[i], event, error)
                i += 1
        if records:
            per_record = (time.monotonic() - started) / len(records)
            self._per_record = (
                per_record if not self._per_record else 0.7 * self._per_record + 0.3 * per_record
            )

    def _next_batch_size(self) -> int:
        # Sized so that a batch takes about BATCH_SECONDS: rebalances and max.poll.interval.ms wait for it.
        if not self._per_record:
            return 1
        return max(1, min(self.batch_size, int(BATCH_SECONDS / self._per_record)))

    def _apply_batch(self, records: list[Any]) -> tuple[int, tuple[Event, BaseException] | None]:
        """``(records committed, (event, error) of the record that ended the batch, if any)``: one
        transaction with every guard row in one statement, then the handler for each new event. A handler
        that raises rolls the whole transaction back; it is done again without that record and those after."""
        assert self._conn is not None, "run() opens the connection"
        events: list[Event] = []
        for message in records:
            try:
                event = self.deserializer(message)
            except Exception:  # undecodable, or the registry is down: the per-record path decides
                break
            if not event.id:
                break
            events.append(event)
        failed: tuple[Event, BaseException] | None = None
        while events:
            try:
                with self._conn.transaction():
                    new = mark_many(self._conn, self.table, [e.id for e in events], self.name)
                    handled: set[str] = set()
                    for index, event in enumerate(events):
                        if event.id in new and event.id not in handled:
                            try:
                                self.handler(self._conn, event)
                            except Exception as exc:
                                raise _BatchEnded(index, exc) from exc
                            handled.add(event.id)
            except _BatchEnded as ended:
                failed, events = (events[ended.index], ended.error), events[: ended.index]
                continue
            except Exception as exc:  # the guard statement itself (a deadlock, a lost connection)
                return 0, (events[0], exc)
            counted: set[str] = set()
            for event in events:  # an id twice in one batch: the second is a duplicate
                self._count(event, event.id in handled and event.id not in counted)
                counted.add(event.id)
            return len(events), failed
        return 0, failed
