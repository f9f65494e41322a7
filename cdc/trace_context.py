"""The W3C trace context of outbox rows and Kafka records: read, checked, carried; pure, and cheap.

The context travels as W3C Trace Context: a ``traceparent`` (``00-<32 hex trace id>-<16 hex parent id>-<2 hex
flags>``) and an optional ``tracestate``, in the row's ``headers`` and then as Kafka headers of the same names
with UTF-8 values, which is what OpenTelemetry's Kafka instrumentations (Java's among them) read and write.
Debezium's ``tracingspancontext`` column holds the same two keys as Java ``Properties`` text
(:func:`properties_context`).

Nothing here needs OpenTelemetry, which is optional (``pip install 'outbox-cdc[otel]'``), but for the two
functions that hand out its objects: without its API, :func:`current_headers` is empty and
:func:`remote_context` None. The SDK's set-up, export and its metrics are :mod:`cdc.tracing`'s.

Cost: a row without a ``traceparent`` costs nothing here; an unsampled one costs :func:`is_sampled`, one byte
test, and never becomes an OpenTelemetry object; only a sampled one is parsed whole and gets a Context.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
except ImportError:  # the [otel] extra is not installed
    otel_trace = None  # type: ignore[assignment]
else:
    _EMPTY_STATE = TraceState()  # immutable: one for every context without a tracestate

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = [
    "SAMPLED_LAST",
    "SAMPLED_PLAIN",
    "TRACEPARENT",
    "TRACESTATE",
    "context_headers",
    "current_headers",
    "find_context",
    "format_traceparent",
    "is_sampled",
    "parse_traceparent",
    "plain_child",
    "properties_context",
    "remote_context",
    "remote_span_context",
    "replace_context",
    "replace_headers",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# W3C Trace Context, level 1: lower-case hex only; a later version may append fields after a '-'.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
SAMPLED_LAST = frozenset(b"13579bdf")  # the last hex digit of the flags, when bit 0 (sampled) is set
# What parse_traceparent takes, narrowed to the relay's common case in one match: version 00, neither id all
# zeros, sampled with flags 01 or 03 (the random bit) and nothing else set (cdc.stream.spans' fast path).
SAMPLED_PLAIN = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-0[13]").fullmatch


def parse_traceparent(value: bytes | str) -> tuple[int, int, int] | None:
    """``(trace id, parent span id, flags)`` of a W3C ``traceparent``, or None when it is not a valid one,
    which the standard says to ignore: wrong shape, upper-case hex, version ``ff``, a version ``00`` with more
    after it, an all-zero trace or parent id."""
    raw = value.encode("ascii", "replace") if isinstance(value, str) else value
    match = _TRACEPARENT.fullmatch(raw.strip(b" \t"))
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def plain_child(headers: list[tuple[str, str | bytes | None]], first: int, span_id: int) -> bytes | None:
    """The relay's common case, in one call: when ``headers[first:]`` (a row's headers, at the end of its
    record's) hold one ``traceparent``, which :data:`SAMPLED_PLAIN` takes, and no ``tracestate``, that
    traceparent is replaced in its place by its child's (the same trace id and flags, ``span_id`` as the
    parent id), as :func:`replace_headers` would, and the row's is returned. Otherwise None, and ``headers``
    are left as they came. ``cdc._fastpath.plain_child`` does the same (tests/unit/test_trace_context.py)."""
    if not 0 < span_id < 1 << 64 or first < 0:
        return None  # not an id the SDK would make, or not a place in the list: the general path decides
    found = -1
    for i in range(first, len(headers)):
        key = headers[i][0]
        if key == TRACEPARENT:
            if found >= 0:
                return None
            found = i
        elif key == TRACESTATE:
            return None
    if found < 0:
        return None
    traceparent = headers[found][1]
    if type(traceparent) is not bytes or SAMPLED_PLAIN(traceparent) is None:
        return None
    headers[found] = (TRACEPARENT, b"%b%016x%b" % (traceparent[:36], span_id, traceparent[52:]))
    return traceparent


def is_sampled(traceparent: bytes) -> bool:
    """Whether a row's ``traceparent`` is valid and sampled: the pipeline's test per row. An unsampled one of
    version 00 is answered by its last byte, and passes through as it came."""
    if len(traceparent) == 55 and traceparent[54] not in SAMPLED_LAST:
        return False
    parsed = parse_traceparent(traceparent)
    return parsed is not None and bool(parsed[2] & 1)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def find_context(headers: Iterable[tuple[str, bytes | None]]) -> tuple[bytes, bytes | None] | None:
    """The first ``traceparent`` of ``headers`` (Kafka's, or a row's as :func:`cdc.stream.route.parse_headers`
    makes them) with the first ``tracestate``, or None when there is no traceparent. Not validated."""
    parent: bytes | None = None
    state: bytes | None = None
    for key, value in headers:
        if key == TRACEPARENT and parent is None:
            parent = value or b""
        elif key == TRACESTATE and state is None:
            state = value
    return None if parent is None else (parent, state)


def remote_context(traceparent: bytes | str, tracestate: bytes | str | None = None) -> Context | None:
    """An OpenTelemetry Context whose current span is the remote parent a ``traceparent`` names (sampled or
    not: the sampler decides), to start a child span in; None when the traceparent is not valid or
    OpenTelemetry is not installed. A ``tracestate`` that does not parse is left out, as the standard says."""
    parent = remote_span_context(traceparent, tracestate)
    return None if parent is None else otel_trace.set_span_in_context(NonRecordingSpan(parent))


def remote_span_context(
    traceparent: bytes | str, tracestate: bytes | str | None = None, *, sampled_only: bool = False
) -> SpanContext | None:
    """The remote parent's SpanContext that :func:`remote_context` puts in its Context; with
    ``sampled_only``, None too when the traceparent is not sampled (the relay's test, in one parse)."""
    parsed = parse_traceparent(traceparent)
    if parsed is None or otel_trace is None or (sampled_only and not parsed[2] & 1):
        return None
    trace_id, span_id, flags = parsed
    state = _EMPTY_STATE
    if tracestate:
        text = tracestate.decode("utf-8", "replace") if isinstance(tracestate, bytes) else tracestate
        state = TraceState.from_header([text])
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags), trace_state=state)


def context_headers(span: Any) -> list[tuple[str, bytes]]:
    """The Kafka headers that carry ``span``'s context (an OpenTelemetry Span or SpanContext):
    ``traceparent``, and ``tracestate`` when it has one. Empty for an invalid (no-op) context."""
    ctx = span.get_span_context() if hasattr(span, "get_span_context") else span
    if not ctx.is_valid:
        return []
    out = [(TRACEPARENT, b"00-%032x-%016x-%02x" % (ctx.trace_id, ctx.span_id, ctx.trace_flags & 0xFF))]
    if ctx.trace_state:  # most have none: its header is not written for nothing
        state = ctx.trace_state.to_header()
        if state:
            out.append((TRACESTATE, state.encode()))
    return out


def replace_context(headers: list[tuple[str, bytes]], span: Any) -> list[tuple[str, bytes]]:
    """``headers`` with their ``traceparent`` and ``tracestate`` replaced by ``span``'s context (the relay's
    send span replaces the row's), in place of the first traceparent, or at the end when there was none."""
    return replace_headers(headers, context_headers(span))


def replace_headers(
    headers: list[tuple[str, bytes]], new: list[tuple[str, bytes]]
) -> list[tuple[str, bytes]]:
    """``headers`` with their ``traceparent`` and ``tracestate`` replaced by ``new``, as
    :func:`replace_context` does."""
    out: list[tuple[str, bytes]] = []
    for key, value in headers:
        if key == TRACEPARENT:
            out += new
            new = []
        elif key != TRACESTATE:
            out.append((key, value))
    return out + new


def current_headers() -> dict[str, str]:
    """The active OpenTelemetry span's context as row headers (``traceparent``, and ``tracestate`` when
    set), for :func:`cdc.outbox.emit`; empty when no valid span is active or OpenTelemetry is not installed.
    An unsampled context is written too: the sampling decision travels with it."""
    if otel_trace is None:
        return {}
    ctx = otel_trace.get_current_span().get_span_context()
    return {k: v.decode() for k, v in context_headers(ctx)}


# Debezium's tracingspancontext column: java.util.Properties.store() text. Only these keys are taken.
_PROPERTIES_KEYS = (TRACEPARENT, TRACESTATE)
_PROPERTIES_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def properties_context(text: bytes) -> tuple[tuple[str, bytes], ...]:
    """The ``traceparent`` and ``tracestate`` of Java ``Properties`` text (Debezium's ``tracingspancontext``
    column: ``#<date>`` then ``traceparent=00-...``), as header pairs; empty when it holds neither.

    Reads what ``Properties.store`` writes: ``#``/``!`` comments, ``key=value``, ``key:value`` or
    ``key value``, backslash escapes (``\\=``, ``\\:``, ``\\uXXXX``) and lines continued by a final
    backslash."""
    found: dict[str, str] = {}
    lines = text.decode("latin-1").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continued(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        match = re.match(r"((?:[^\\=: \t\f]|\\.)*)[ \t\f]*[=:]?[ \t\f]*(.*)", line, re.S)
        assert match is not None  # every line matches, the key may be empty
        key, value = _unescape(match[1]), _unescape(match[2])
        if key in _PROPERTIES_KEYS:
            found[key] = value  # the last of a key, as Properties.load keeps it
    return tuple((k, found[k].encode()) for k in _PROPERTIES_KEYS if k in found)


def _continued(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        body = match[1]
        if body[0] == "u":
            return chr(int(body[1:], 16)) if len(body) == 5 else body[1:]
        return _PROPERTIES_ESCAPES.get(body, body)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text, flags=re.S)
