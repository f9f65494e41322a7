"""Producing one record: as it comes, or alone when Kafka refused it before, and the check of a record
against its topic's limit before it is sent.

Owns the digest of the record being produced alone (what the replay after a refusal learns about). Every
record the pipeline hands to Kafka goes through here or through the sink's own produce on the hot path's
common case: events and dead letters alike. Gets the sink, the refusal ledger
(:mod:`cdc.stream.refusals`), the source transaction being read (whose commit time stamps the records), and
callables: ``until_empty`` (the producer's queue emptied), ``keep_alive`` (while the queue is full) and
``fail`` (the producer stopped: the pipeline's failure path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from cdc.errors import EventError, EventTooLargeError
from cdc.stream.checkpoint import SourceTransaction
from cdc.stream.refusals import RefusalLedger, record_digest, worst_case_size
from cdc.stream.sink import DeliveryCallback, Headers, KafkaSink, ProducerStoppedError


class Sender:
    def __init__(
        self,
        sink: KafkaSink,
        refusals: RefusalLedger,
        current: SourceTransaction,
        *,
        until_empty: Callable[[], None],
        keep_alive: Callable[[], None],
        fail: Callable[[], NoReturn],
    ) -> None:
        self._sink = sink
        self._refusals = refusals
        self._current = current
        self._until_empty = until_empty
        self._keep_alive = keep_alive
        self._fail = fail
        self.alone: bytes | None = None  # the digest of the record produced alone, while it is

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        """Produce one record; alone (the queue empty before and after) when Kafka refused it before, so
        that what Kafka says is about this record only. Its timestamp: the commit's, unless given."""
        refusals, sink = self._refusals, self._sink
        ts = self._current.ts_ms if timestamp_ms is None else timestamp_ms
        digest = record_digest(topic, key, value) if refusals.active else None
        try:
            if digest is not None and refusals.must_go_alone(digest):
                self._until_empty()
                self.alone = digest
                sink.produce(topic, key, value, headers, ts, on_delivery, self._keep_alive)
                self._until_empty()
                self.alone = None
                refusals.cleared(digest)
                return
            sink.produce(topic, key, value, headers, ts, on_delivery, self._keep_alive)
        except ProducerStoppedError:
            self._fail()

    def refusal(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers, limit: int | None
    ) -> EventError | None:
        """Why the record may not be produced: above the topic's limit, or refused by Kafka when alone."""
        if limit is not None:
            raw = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)
            if worst_case_size(raw) > limit:
                return EventTooLargeError(
                    f"the record ({raw} bytes) may be above topic '{topic}''s max.message.bytes ({limit})"
                )
        if self._refusals.active:
            return self._refusals.culprit_error(record_digest(topic, key, value), topic)
        return None
