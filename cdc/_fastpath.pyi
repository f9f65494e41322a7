# The compiled extension (rust/src/lib.rs), built by `make install` when cargo is on PATH: cdc.fastpath.
from collections.abc import Callable
from typing import Any

class Encoder:
    """cdc.avro.compiled: a JSON payload to the header + Avro body; `reference` for what it is not sure of."""

    def __init__(
        self, header: bytes, program: tuple[Any, ...], reference: Callable[[Any], bytes]
    ) -> None: ...
    def __call__(self, payload: Any) -> bytes: ...
    def compiled_only(self, payload: Any) -> bytes | None: ...

class RowReader:
    """cdc.stream.route: a whole XLogData Insert of the outbox table to its row's fields, or None."""

    def __init__(
        self, oid: int, required: tuple[int, ...], version: int | None, headers: int | None
    ) -> None: ...
    def __call__(
        self, message: bytes
    ) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None] | None: ...

def send_span(span: Any) -> bytes | None:
    """cdc.trace_export: a cdc.trace_span.SendSpan's OTLP Span message, or None for Python to write."""

def plain_child(headers: list[tuple[str, Any]], first: int, span_id: int) -> bytes | None:
    """cdc.trace_context.plain_child: a row's plain sampled traceparent replaced by its child's, in place."""
