"""The relay's spans as plain records: OpenTelemetry's sampling and export, without the SDK's Span object.

The SDK's Span costs about 20 µs to start, note and end (a lock, bounded attributes, a Context, the span's
own metrics), which is most of what a sampled event costs the relay; at 1 % of rows sampled, that alone is
3 % of the relay's CPU. :class:`SpanMaker` makes a :class:`RelaySpan` instead: a slotted record with the same
fields. What stays OpenTelemetry's own, read from the provider that :func:`cdc.tracing.start` set up from the
``OTEL_*`` variables: the sampler (``OTEL_TRACES_SAMPLER``: its decision, its attributes and trace state),
the id generator, the resource, and the bounded batch processor that exports. A RelaySpan reads as the SDK's
ReadableSpan does, for :mod:`cdc.trace_export` and for the OTLP library's encoder alike:
``tests/unit/test_trace_span.py`` holds both encodings of one to an SDK span's, byte for byte.

What it leaves to the SDK (:attr:`SpanMaker.usable` is False, and the relay makes SDK spans): span limits
tighter than the relay's spans need (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` under 16, or a value length limit),
which the SDK enforces in its own way.

The common case, a row whose sampled ``traceparent`` has no ``tracestate``, under a sampler that keeps every
child of a sampled remote parent, is a :class:`SendSpan`: the row's fields and ``traceparent`` as they came,
and a new span id. Its OpenTelemetry values (the ids, the contexts, the name, the attributes) are made when
first read, which is on the processor's export thread, in batches. At 1 % of rows sampled, a span's code
runs once per hundred events, cold, and costs the relay's loop several times what it costs in a loop of
spans (``python -m tests.bench.cold_span`` measures both): the less of it there, the better.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from functools import partial
from time import time_ns
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["RelaySpan", "SendSpan", "SpanMaker"]

ATTRIBUTES_NEEDED = 16  # the relay's spans hold at most 12 attributes; below this limit the SDK makes them
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | 0x02)
_RANDOM = 0x02  # W3C level 2's random trace id flag, which the SDK carries from the parent
_EMPTY_STATE = TraceState()
_ZERO = ord("0")


class RelaySpan:
    """One span of the relay, from its start to its export. The SDK's Span and ReadableSpan in the parts the
    relay, the batch processor and the encoders use; ended once, then left as it is."""

    __slots__ = (
        "name",
        "context",
        "parent",
        "resource",
        "instrumentation_scope",
        "start_time",
        "end_time",
        "attributes",
        "status",
        "_on_end",
    )
    kind = SpanKind.PRODUCER
    events: tuple[()] = ()
    links: tuple[()] = ()
    dropped_attributes = 0
    dropped_events = 0
    dropped_links = 0

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        resource: Resource,
        scope: InstrumentationScope,
        start_time: int,
        attributes: dict[str, Any],
        on_end: Callable[[Any], None],
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.resource = resource
        self.instrumentation_scope = scope
        self.start_time = start_time
        self.end_time: int | None = None
        self.attributes = attributes
        self.status = _UNSET
        self._on_end = on_end

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:  # as the SDK: an ended span is not changed
            self.attributes[key] = value

    def set_status(self, status: Status) -> None:
        if self.end_time is None and self.status.status_code is not StatusCode.OK:
            self.status = status

    def end(self) -> None:
        if self.end_time is None:
            self.end_time = time_ns()
            self._on_end(self)


class SendSpan:
    """A relay's ``send <topic>`` span, child of a row's sampled remote parent (without trace state): what
    :class:`RelaySpan` holds, kept as the row gave it until first read. Its name, contexts and attributes are
    made then, once: on the export thread, after it ended (nothing changes it after its end)."""

    __slots__ = (
        "_topic",
        "_fields",
        "_traceparent",
        "span_id",
        "resource",
        "instrumentation_scope",
        "start_time",
        "end_time",
        "status",
        "_late",
        "_attributes",
        "_context",
        "_on_end",
    )
    kind = SpanKind.PRODUCER
    events: tuple[()] = ()
    links: tuple[()] = ()
    dropped_attributes = 0
    dropped_events = 0
    dropped_links = 0

    def __init__(
        self,
        topic: str,
        fields: tuple[bytes | None, bytes | str, bytes | str, bytes | int, bytes],
        traceparent: bytes,
        span_id: int,
        maker: SpanMaker,
        start_time: int,
        on_end: Callable[[Any], None],
    ) -> None:
        self._topic = topic
        self._fields = fields  # the record's key, the event's id, type and schema version, the commit LSN
        # The row's, as it came (cdc.trace_context.SAMPLED_PLAIN took it): its ids are read on the export
        # thread, when first asked for.
        self._traceparent = traceparent
        self.span_id = span_id
        self.resource = maker.resource
        self.instrumentation_scope = maker.scope
        self.start_time = start_time
        self.end_time: int | None = None
        self.status = _UNSET
        self._late: dict[str, Any] = {}  # set after the start: where Kafka put the record
        self._attributes: dict[str, Any] | None = None
        self._context: SpanContext | None = None
        self._on_end = on_end

    @property
    def name(self) -> str:
        return f"send {self._topic}"

    @property
    def _trace_id(self) -> int:
        return int(self._traceparent[3:35], 16)

    @property
    def _parent_id(self) -> int:
        return int(self._traceparent[36:52], 16)

    @property
    def _flags(self) -> int:
        """The parent's: sampled, and the random bit, which the child keeps (01 or 03: its last digit)."""
        return self._traceparent[54] - _ZERO

    @property
    def context(self) -> SpanContext:
        context = self._context
        if context is None:
            flags = _SAMPLED_RANDOM if self._flags & _RANDOM else _SAMPLED
            context = self._context = SpanContext(
                self._trace_id, self.span_id, is_remote=False, trace_flags=flags, trace_state=_EMPTY_STATE
            )
        return context

    @property
    def parent(self) -> SpanContext:
        return SpanContext(
            self._trace_id,
            self._parent_id,
            is_remote=True,
            trace_flags=TraceFlags(self._flags),
            trace_state=_EMPTY_STATE,
        )

    @property
    def attributes(self) -> dict[str, Any]:
        attributes = self._attributes
        if attributes is None:
            attributes = self._attributes = dict(self._pairs())
        return attributes

    def _pairs(self) -> tuple[tuple[str, Any], ...]:
        key, event_id, event_type, version, lsn = self._fields
        return (*send_pairs(self._topic, key, event_id, event_type, version, lsn), *self._late.items())

    def wire(self) -> tuple[int, int, int, str, int, int | None, Iterable[tuple[str, Any]], Status]:
        """Its fields as :mod:`cdc.trace_export` writes them, which makes neither its contexts nor its
        attributes' dict: trace id, span id, parent id, name, start, end, attributes, status."""
        attributes = self._attributes
        pairs = self._pairs() if attributes is None else attributes.items()
        ids = self._trace_id, self.span_id, self._parent_id
        return *ids, f"send {self._topic}", self.start_time, self.end_time, pairs, self.status

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:
            if self._attributes is None and key not in _SEND_KEYS:
                self._late[key] = value
            else:
                self.attributes[key] = value  # one of its first: changed in its place, as a dict does

    def set_status(self, status: Status) -> None:
        if self.end_time is None and self.status.status_code is not StatusCode.OK:
            self.status = status

    def end(self) -> None:
        if self.end_time is None:
            self.end_time = time_ns()
            self._on_end(self)

    def note_delivery(self, err: Any, msg: Any, end: bool) -> None:
        """Kafka's delivery report of its record (confluent-kafka's ``err`` and ``msg``): where the record
        went, or the error; ended when ``end`` (the record is final). What ``set_attribute``,
        ``set_status`` and ``end`` would do, in one call."""
        if self.end_time is not None:
            return
        if err is None:
            notes = self._late if self._attributes is None else self._attributes
            notes["messaging.destination.partition.id"] = str(msg.partition())
            notes["messaging.kafka.offset"] = msg.offset()
        elif self.status.status_code is not StatusCode.OK:
            self.status = Status(StatusCode.ERROR, f"not delivered: {err}")
        if end:
            self.end_time = time_ns()
            self._on_end(self)


def send_pairs(
    topic: str,
    key: bytes | None,
    event_id: bytes | str,
    event_type: bytes | str,
    version: bytes | int,
    lsn: bytes,
) -> tuple[tuple[str, Any], ...]:
    """A relay's ``send`` span's attributes at its start, as (key, value) pairs in their order:
    OpenTelemetry's messaging conventions for Kafka, and the event's type, schema version and commit LSN."""
    return (
        ("messaging.system", "kafka"),
        ("messaging.operation.type", "send"),
        ("messaging.destination.name", topic),
        ("messaging.kafka.message.key", _text(key)),
        ("messaging.message.id", _text(event_id)),
        ("cdc.event_type", _text(event_type)),
        ("cdc.schema_version", int(version)),
        ("cdc.commit_lsn", lsn.decode()),
    )


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# send_pairs' keys: a late value for one of them changes it in its place (SendSpan.set_attribute).
_SEND_KEYS = frozenset(key for key, _ in send_pairs("", None, "", "", 0, b""))


class SpanMaker:
    """RelaySpans of kind PRODUCER, sampled and identified by the provider's own sampler and id generator,
    each handed to ``on_end`` (the batch processor's) when it ends, sampled or not: the processor exports
    the sampled ones only, as it does the SDK's."""

    def __init__(
        self,
        provider: TracerProvider,
        on_end: Callable[[Any], None],
        *,
        scope: str,
        on_end_sampled: Callable[[Any], None] | None = None,
    ) -> None:
        # on_end: a span processor's, typed for the SDK's ReadableSpan, whose shape a RelaySpan has;
        # on_end_sampled, when given, the same for a span known to be sampled (it reads no context)
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        # A new span id without a Python frame: the SDK's RandomIdGenerator draws random.getrandbits(64)
        # (drawn again when 0, which the caller asks generate_span_id for).
        self.new_span_id: Callable[[], int] = (
            partial(random.getrandbits, 64)
            if type(self._ids) is RandomIdGenerator
            else self._ids.generate_span_id
        )
        self.generate_span_id = self._ids.generate_span_id
        self.resource = provider.resource
        self.scope = InstrumentationScope(scope)  # what provider.get_tracer(scope) names
        self._on_end = on_end
        self._on_end_sampled = on_end_sampled or on_end
        # The SDK's samplers that keep every child of a sampled remote parent, with its trace state and the
        # span's own attributes (always_on; the parent-based ones by default): their answer is known before
        # they are asked, which saves a Context and the sampler's call (a third of a span's cost).
        sampler = self._sampler
        description = sampler.get_description()
        self.keeps_sampled_children = description == "AlwaysOnSampler" or (
            type(sampler) is ParentBased
            and f"remoteParentSampled:{ALWAYS_ON.get_description()}," in description
        )
        limits = SpanLimits()  # the OTEL_*_LIMIT variables, read as the SDK reads them
        self.usable = (
            limits.max_span_attributes is None or limits.max_span_attributes >= ATTRIBUTES_NEEDED
        ) and limits.max_span_attribute_length is None

    def send(
        self,
        topic: str,
        fields: tuple[bytes | None, bytes | str, bytes | str, bytes | int, bytes],
        traceparent: bytes,
        span_id: int,
        start_time: int,
    ) -> SendSpan:
        """The ``send`` span, with the id ``span_id`` (from :attr:`new_span_id`), of a record whose row's
        ``traceparent`` is sampled, plain (what :data:`cdc.trace_context.SAMPLED_PLAIN` takes) and without
        trace state; only when :attr:`keeps_sampled_children` (the sampler's answer is then known)."""
        return SendSpan(topic, fields, traceparent, span_id, self, start_time, self._on_end_sampled)

    def start(
        self, name: str, parent: SpanContext | None, attributes: dict[str, Any], start_time: int
    ) -> RelaySpan:
        """A span named ``name``, child of ``parent`` (a remote context; None: a new trace), started at
        ``start_time`` (ns), as the SDK's tracer would start it."""
        if parent is not None and parent.trace_flags.sampled and self.keeps_sampled_children:
            flags = _SAMPLED_RANDOM if parent.trace_flags & _RANDOM else _SAMPLED
            own = SpanContext(
                parent.trace_id,
                self._ids.generate_span_id(),
                is_remote=False,
                trace_flags=flags,
                trace_state=parent.trace_state,
            )
            return RelaySpan(
                name, own, parent, self.resource, self.scope, start_time, attributes, self._on_end
            )
        if parent is None:
            context = None
            trace_id = self._ids.generate_trace_id()
            random = self._ids.is_trace_id_random()
        else:
            context = set_span_in_context(NonRecordingSpan(parent))
            trace_id = parent.trace_id
            random = bool(parent.trace_flags & _RANDOM)
        result = self._sampler.should_sample(context, trace_id, name, SpanKind.PRODUCER, attributes, ())
        flags = _SAMPLED if result.decision.is_sampled() else _NOT_SAMPLED  # type: ignore[no-untyped-call]
        if random:
            flags = TraceFlags(flags | _RANDOM)
        own = SpanContext(
            trace_id,
            self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=result.trace_state,
        )
        return RelaySpan(
            name, own, parent, self.resource, self.scope, start_time, dict(result.attributes), self._on_end
        )
