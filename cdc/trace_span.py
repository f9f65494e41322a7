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
"""

from __future__ import annotations

from collections.abc import Callable
from time import time_ns
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["RelaySpan", "SpanMaker"]

ATTRIBUTES_NEEDED = 16  # the relay's spans hold at most 12 attributes; below this limit the SDK makes them
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | 0x02)
_RANDOM = 0x02  # W3C level 2's random trace id flag, which the SDK carries from the parent


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


class SpanMaker:
    """RelaySpans of kind PRODUCER, sampled and identified by the provider's own sampler and id generator,
    each handed to ``on_end`` (the batch processor's) when it ends, sampled or not: the processor exports
    the sampled ones only, as it does the SDK's."""

    def __init__(self, provider: TracerProvider, on_end: Callable[[Any], None], *, scope: str) -> None:
        # on_end: a span processor's, typed for the SDK's ReadableSpan, whose shape a RelaySpan has
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._scope = InstrumentationScope(scope)  # what provider.get_tracer(scope) names
        self._on_end = on_end
        # The SDK's samplers that keep every child of a sampled remote parent, with its trace state and the
        # span's own attributes (always_on; the parent-based ones by default): their answer is known before
        # they are asked, which saves a Context and the sampler's call (a third of a span's cost).
        sampler = self._sampler
        description = sampler.get_description()
        self._keeps_sampled_children = description == "AlwaysOnSampler" or (
            type(sampler) is ParentBased
            and f"remoteParentSampled:{ALWAYS_ON.get_description()}," in description
        )
        limits = SpanLimits()  # the OTEL_*_LIMIT variables, read as the SDK reads them
        self.usable = (
            limits.max_span_attributes is None or limits.max_span_attributes >= ATTRIBUTES_NEEDED
        ) and limits.max_span_attribute_length is None

    def start(
        self, name: str, parent: SpanContext | None, attributes: dict[str, Any], start_time: int
    ) -> RelaySpan:
        """A span named ``name``, child of ``parent`` (a remote context; None: a new trace), started at
        ``start_time`` (ns), as the SDK's tracer would start it."""
        if parent is not None and parent.trace_flags.sampled and self._keeps_sampled_children:
            flags = _SAMPLED_RANDOM if parent.trace_flags & _RANDOM else _SAMPLED
            own = SpanContext(
                parent.trace_id,
                self._ids.generate_span_id(),
                is_remote=False,
                trace_flags=flags,
                trace_state=parent.trace_state,
            )
            return RelaySpan(
                name, own, parent, self._resource, self._scope, start_time, attributes, self._on_end
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
            name, own, parent, self._resource, self._scope, start_time, dict(result.attributes), self._on_end
        )
