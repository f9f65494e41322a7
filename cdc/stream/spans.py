"""The relay's spans: one PRODUCER span ``send <topic>`` per traced event, so that a trace goes on from the
request that wrote the outbox row, through the WAL, the relay and Kafka, to the consumer.

Owns nothing of the stream: it is handed OpenTelemetry's tracer (:mod:`cdc.tracing`, set up from the
``OTEL_*`` variables) and the ``tracing`` setting. Which events: with ``row-context-only`` (the default),
those whose row carries a sampled W3C ``traceparent`` (an unsampled one passes through as it came, and no span
object is made); with ``always``, every event, a row's context or not. A span:

- is a child of the row's context, named ``send <topic>``, of kind PRODUCER, with OpenTelemetry's messaging
  attributes for Kafka (``messaging.system``, ``messaging.destination.name``, the partition and the offset
  once acknowledged, the key, the event id as ``messaging.message.id``) and the event type, schema version
  and commit LSN;
- starts at the source transaction's commit time and ends when the record is final: acknowledged by Kafka
  (at-least-once), or when its Kafka transaction commits (exactly-once; an aborted one's spans say so). Its
  length is the event's time from commit to Kafka;
- replaces the row's ``traceparent`` and ``tracestate`` in the record's headers, so that the consumer's span
  is its child.

A dead-lettered event's span carries an error status and the reason. The spans are plain records
(:mod:`cdc.trace_span`), sampled by the SDK's own sampler, and exported by its batch processor: ending one
only queues it, the export runs on the processor's thread, bounded, and a lost span is counted, never waited
for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    set_span_in_context,
)

from cdc.stream.sink import DeliveryCallback, Headers
from cdc.trace_context import find_context, plain_child, remote_span_context, replace_context
from cdc.trace_processor import Tracing
from cdc.trace_span import SendSpan, SpanMaker, send_pairs
from cdc.tracing import INSTRUMENTATION

Span = Any  # opentelemetry.trace.Span: the SDK is an optional extra
log = logging.getLogger("cdc.tracing")


class RelaySpans:
    def __init__(self, tracing: Tracing, *, track: Callable[[Span], bool]) -> None:
        self._tracer = tracing.tracer
        processor = tracing.processor
        maker = SpanMaker(
            tracing.provider,
            processor.on_end,
            scope=INSTRUMENTATION,
            on_end_sampled=getattr(processor, "on_end_sampled", None),
        )
        self._maker = maker if maker.usable else None  # None: span limits the SDK's Span enforces
        # A row's sampled parent gets a SendSpan (fewest steps) when the sampler's answer is known.
        self._send = maker.send if maker.usable and maker.keeps_sampled_children else None
        self._new_span_id, self._generate_span_id = maker.new_span_id, maker.generate_span_id
        self._plain_child = tracing.plain_child or plain_child  # compiled, or Python's
        self.always = tracing.mode == "always"
        self._track = track  # the publisher's: True when a span ends at its record's acknowledgement

    def start(
        self,
        headers: Headers,
        row_headers: Sequence[tuple[str, bytes | None]] | None,
        topic: str,
        key: bytes | None,
        event_id: bytes | str,
        event_type: bytes | str,
        version: bytes | int,
        lsn: bytes,
        commit_time_us: int,
    ) -> tuple[Span, Headers] | None:
        """A span for the record about to be produced, and its headers carrying the span's context; None when
        the event is not traced. Only the row's own headers (``row_headers``) can hold its context. The
        relay's loop (cdc.stream.emit) answers most unsampled ones by their last byte before calling."""
        send = self._send
        if send is not None and row_headers:
            # The common case in one call: a sampled plain traceparent (version 00, flags 01 or 03, no trace
            # state), replaced in place by its child's. Its code runs once per hundred events at 1 %, cold.
            span_id = self._new_span_id() or self._generate_span_id()
            traceparent = self._plain_child(headers, len(headers) - len(row_headers), span_id)
            if traceparent is not None:
                fields = (key, event_id, event_type, version, lsn)
                return send(topic, fields, traceparent, span_id, commit_time_us * 1000), headers
        context = find_context(row_headers or ())
        if context is None:
            if not self.always:
                return None
            parent = None
        else:
            traceparent, state = context
            parent = remote_span_context(traceparent, state, sampled_only=True)
            if parent is None:
                return None  # not sampled, or not a valid traceparent: the row's headers go on as they came
        span = self._start(
            f"send {topic}",
            parent,
            dict(send_pairs(topic, key, event_id, event_type, version, lsn)),
            commit_time_us * 1000,
        )
        return span, replace_context(headers, span)  # type: ignore[arg-type,return-value]

    def _start(
        self, name: str, parent: SpanContext | None, attributes: dict[str, Any], start_ns: int
    ) -> Span:
        """A PRODUCER span: a plain RelaySpan (cdc.trace_span), or the SDK's own when span limits ask."""
        if self._maker is not None:
            return self._maker.start(name, parent, attributes, start_ns)
        return self._tracer.start_span(
            name,
            context=None if parent is None else set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.PRODUCER,
            start_time=start_ns,
            attributes=attributes,
        )

    def delivered(self, span: Span, on_delivery: DeliveryCallback) -> DeliveryCallback:
        """``on_delivery``, noting on the span where the record went (and ending it, when it is final)."""
        ends = self._track(span)
        if type(span) is SendSpan:  # the common case: one call notes it all (its code runs cold)

            def acknowledged(err: Any, msg: Any) -> None:
                try:
                    span.note_delivery(err, msg, ends)
                except Exception:  # noqa: BLE001 - a span must never cost the record's acknowledgement
                    _span_failed()
                on_delivery(err, msg)

            return acknowledged

        def report(err: Any, msg: Any) -> None:
            try:
                if err is None:
                    span.set_attribute("messaging.destination.partition.id", str(msg.partition()))
                    span.set_attribute("messaging.kafka.offset", msg.offset())
                else:
                    span.set_status(Status(StatusCode.ERROR, f"not delivered: {err}"))
                if ends:
                    span.end()
            except Exception:  # noqa: BLE001 - a span must never cost the record's acknowledgement
                _span_failed()
            on_delivery(err, msg)

        return report

    def not_sent(self, span: Span, reason: str) -> None:
        """The record was never handed to Kafka (too large: it is dead-lettered): its span ends now, with
        the reason. Exactly once, the Kafka transaction's end skips it (:func:`end_all`)."""
        span.set_status(Status(StatusCode.ERROR, f"not sent: {reason}"))
        span.end()

    def dead_lettered(
        self, row_headers: Headers, dlq_topic: str, event_id: str, reason: str, commit_time_us: int
    ) -> Headers:
        """A dead-lettered event's span (error status, the reason), ended at once; the dead letter's row
        headers carry its context."""
        context = find_context(row_headers)  # type: ignore[arg-type]
        if context is None and not self.always:
            return row_headers
        parent = None if context is None else remote_span_context(*context, sampled_only=True)
        if context is not None and parent is None:
            return row_headers  # not sampled, or not valid: the parent decided
        span = self._start(
            f"send {dlq_topic}",
            parent,
            {
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.destination.name": dlq_topic,
                "messaging.message.id": event_id,
                "cdc.dead_letter_reason": reason,
            },
            commit_time_us * 1000,
        )
        span.set_status(Status(StatusCode.ERROR, f"dead-lettered: {reason}"))
        headers = replace_context(row_headers, span)  # type: ignore[arg-type]
        span.end()
        return headers  # type: ignore[return-value]


def end_all(spans: list[Span], *, committed: bool) -> None:
    """The spans of a Kafka transaction's records, ended with it: committed, or aborted (their records will
    never be read by a read_committed consumer)."""
    for span in spans:
        if getattr(span, "end_time", None) is not None:
            continue  # ended already: its record was never sent (RelaySpans.not_sent)
        if not committed:
            span.set_status(Status(StatusCode.ERROR, "the Kafka transaction was aborted"))
        span.end()
    spans.clear()


_failures = 0


def _span_failed() -> None:
    """OpenTelemetry's SDK raised while a span was noted: said once (with its stack), counted after."""
    global _failures
    _failures += 1
    if _failures == 1:
        log.exception("tracing: noting a delivery on its span failed (said once; the event goes on)")
