"""Finished spans as an OTLP ``ExportTraceServiceRequest``, in protobuf bytes: pure, spans in, bytes out.

opentelemetry-exporter-otlp-proto-common builds a protobuf object per span, per attribute and per value,
then serialises them: 37 µs a span of the relay's (ten attributes), twice what the SDK spends making the
span, and the most of what tracing 1 % of events cost. This writes the same bytes directly (the protobuf
wire format is simple: a tag, a length, the bytes), with each attribute key's encoding kept, in about a
fifth of that. ``tests/unit/test_trace_export.py`` holds it to the library's encoding byte for byte.

A relay's :class:`cdc.trace_span.SendSpan` is written from its fields (its ``wire()``): its contexts and its
attributes' dict are never made, 6 µs a span where a RelaySpan takes 7 and the SDK's Span with the library's
encoder 37.

What it leaves to the library (:func:`encode` returns None, and the caller encodes with it): spans with
events or links, and attribute values that are mappings or of a type the SDK does not allow. The relay makes
none of those; a span from elsewhere in the process (a library's instrumentation) may.

The messages, from opentelemetry-proto's ``trace/v1/trace.proto`` and ``common/v1/common.proto``::

    ExportTraceServiceRequest  1 resource_spans
    ResourceSpans              1 resource  2 scope_spans  3 schema_url
    Resource                   1 attributes
    ScopeSpans                 1 scope  2 spans  3 schema_url
    InstrumentationScope       1 name  2 version  3 attributes
    Span                       1 trace_id  2 span_id  3 trace_state  4 parent_span_id  5 name  6 kind
                               7 start_time_unix_nano (fixed64)  8 end_time_unix_nano (fixed64)
                               9 attributes  10 dropped_attributes_count  12 dropped_events_count
                               14 dropped_links_count  15 status  16 flags (fixed32)
    Status                     2 message  3 code
    KeyValue                   1 key  2 value
    AnyValue                   1 string  2 bool  3 int (int64)  4 double  5 array  7 bytes
    ArrayValue                 1 values
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from struct import Struct
from typing import Any

__all__ = ["encode"]

_FIXED64 = Struct("<Q")
_FIXED32 = Struct("<I")
_DOUBLE = Struct("<d")
# SpanFlags: the flags say whether the parent was remote (opentelemetry-proto's SPAN_FLAGS_CONTEXT_*_MASK).
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_KEYS_KEPT = 4096  # attribute keys whose encoding is kept: a process's keys are few; a bound all the same


def encode(spans: Sequence[Any], send_span: Callable[[Any], bytes | None] | None = None) -> bytes | None:
    """The request for ``spans`` (the SDK's ReadableSpans), grouped by resource and instrumentation scope in
    the order they come, as the library groups them; None when one of them needs the library's encoder.
    ``send_span``, when given, is the compiled writer of a SendSpan (``cdc._fastpath.send_span``): its bytes,
    or None for this module to write it."""
    # Grouped by the objects' identity, then by equality once per object met: a Resource's hash serialises
    # its attributes to JSON, each time it is asked.
    known: dict[tuple[int, int], list[bytes]] = {}
    groups: list[tuple[Any, dict[Any, list[bytes]]]] = []
    try:
        for span in spans:
            if span.events or span.links:
                return None
            resource, scope = span.resource, span.instrumentation_scope or None
            encoded = known.get((id(resource), id(scope)))
            if encoded is None:
                scopes = next((g for r, g in groups if r == resource), None)
                if scopes is None:
                    scopes = {}
                    groups.append((resource, scopes))
                encoded = known[(id(resource), id(scope))] = scopes.setdefault(scope, [])
            wire = getattr(span, "wire", None)  # a cdc.trace_span.SendSpan: its fields, no object made
            if wire is None:
                encoded.append(_span(span))
                continue
            data = None if send_span is None else send_span(span)
            encoded.append(data if data is not None else _send_span(*wire()))
        out = []
        for resource, scopes in groups:
            body = [_message(1, _attributes(1, resource.attributes.items()))]
            for scope, encoded in scopes.items():
                scope_body = [_message(1, _scope(scope)), *encoded]
                if scope is not None and scope.schema_url:
                    scope_body.append(_string(3, scope.schema_url))
                body.append(_message(2, b"".join(scope_body)))
            if resource.schema_url:
                body.append(_string(3, resource.schema_url))
            out.append(_message(1, b"".join(body)))
    except TypeError:  # a value it leaves to the library's (from _value)
        return None
    return b"".join(out)


def _span(span: Any) -> bytes:
    context = span.context
    parent = span.parent
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    state = context.trace_state
    if state:
        parts.append(_string(3, ",".join(f"{key}={value}" for key, value in state.items())))
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_string(5, span.name))
    parts += (b"\x30", _varint(span.kind.value + 1))  # the SDK's SpanKind counts from INTERNAL = 0
    if span.start_time:
        parts += (b"\x39", _FIXED64.pack(span.start_time))
    if span.end_time:
        parts += (b"\x41", _FIXED64.pack(span.end_time))
    if span.attributes:
        parts.append(_attributes(9, span.attributes.items()))
    for field, dropped in (
        (10, span.dropped_attributes),
        (12, span.dropped_events),
        (14, span.dropped_links),
    ):
        if dropped:
            parts += (_varint(field << 3), _varint(dropped))
    status = span.status
    if status is not None:
        parts.append(_status(status))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    parts += (b"\x85\x01", _FIXED32.pack(flags))
    return _message(2, b"".join(parts))


_PRODUCER = b"\x30\x04"  # kind: SpanKind.PRODUCER (3), plus one
_REMOTE_PARENT = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE | _IS_REMOTE)


def _send_span(
    trace_id: int,
    span_id: int,
    parent_id: int,
    name: str,
    start: int,
    end: int | None,
    attributes: Iterable[tuple[str, Any]],
    status: Any,
) -> bytes:
    """What :func:`_span` writes for a PRODUCER span without trace state, child of a remote parent, from
    its fields (``wire()`` of a SendSpan): its contexts and attribute dict are never made."""
    parts = [
        b"\x0a\x10",
        trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        span_id.to_bytes(8, "big"),
        b"\x22\x08",
        parent_id.to_bytes(8, "big"),
        _string(5, name),
        _PRODUCER,
    ]
    if start:
        parts += (b"\x39", _FIXED64.pack(start))
    if end:
        parts += (b"\x41", _FIXED64.pack(end))
    parts += (_attributes(9, attributes), _status(status), _REMOTE_PARENT)
    return _message(2, b"".join(parts))


def _status(status: Any) -> bytes:
    body = b""
    if status.description:
        body = _string(2, status.description)
    if status.status_code.value:
        body += b"\x18" + _varint(status.status_code.value)
    return _message(15, body)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    body = _string(1, scope.name) if scope.name else b""
    if scope.version:
        body += _string(2, scope.version)
    if scope.attributes:
        body += _attributes(3, scope.attributes.items())
    return body


_keys: dict[tuple[int, str], bytes] = {}
_pairs: dict[tuple[bytes, str], bytes] = {}  # (the key's bytes, a string value): the KeyValue's bytes
_PAIRS_KEPT = 4096


def _attributes(field: int, attributes: Iterable[tuple[str, Any]]) -> bytes:
    """Each (key, value) as a KeyValue in ``field``: the key's bytes come from :data:`_keys`."""
    parts: list[bytes] = []
    tag = _varint(field << 3 | 2)
    small = _SMALL
    for key, value in attributes:
        head = _keys.get((field, key))
        if head is None:
            if len(_keys) >= _KEYS_KEPT:
                _keys.clear()
            head = _keys[(field, key)] = _string(1, key)
        if type(value) is str:
            # A relay span's attributes are mostly the same few values (the system, the topic, the event
            # type): their whole KeyValue is kept, the rest (ids, keys, LSNs) is written each time.
            pair = _pairs.get((head, value))
            if pair is not None:
                parts.append(pair)
                continue
            data = value.encode("utf-8")
            n = len(data)
            size = len(head) + 4 + n
            if size < 128:  # the common case: every length one byte, written without a call
                pair = b"".join((tag, small[size], head, b"\x12", small[n + 2], b"\x0a", small[n], data))
                if len(_pairs) >= _PAIRS_KEPT:
                    _pairs.clear()
                _pairs[(head, value)] = pair
                parts.append(pair)
                continue
            value_bytes = b"\x0a" + _varint(n) + data
        else:
            value_bytes = _value(value)
        inner = b"\x12" + _varint(len(value_bytes)) + value_bytes
        parts += (tag, _varint(len(head) + len(inner)), head, inner)
    return b"".join(parts)


def _value(value: Any) -> bytes:
    """An AnyValue's body, the library's way: bool before int (a bool is an int), None as an empty one."""
    if isinstance(value, str):
        return _string(1, value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 63:
            raise TypeError("beyond int64")  # the library's encoder refuses it in its own way
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if value is None:
        return b""
    if isinstance(value, bytes):
        return _bytes(7, value)
    if isinstance(value, Sequence):
        return _message(5, b"".join(_message(1, _value(item)) for item in value))
    raise TypeError(type(value).__name__)


def _string(field: int, text: str) -> bytes:
    return _bytes(field, text.encode("utf-8"))


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _message(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


_SMALL = [bytes((n,)) for n in range(128)]


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_length(value: int) -> int:
    return 1 if value < 128 else (value.bit_length() + 6) // 7
