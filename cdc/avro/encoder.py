"""Encode stage: an outbox payload (JSON) becomes Avro, framed as single-object encoding or Confluent's.

Between ``route`` (an outbox row became an event with a topic) and ``sink`` (Kafka), the pipeline hands each
payload to :class:`AvroEncoder`, which takes the schema from the :class:`~cdc.avro.store.SchemaStore` and
writes ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form +
the Avro binary body (with a schema registry, ``00`` + the schema id instead: :func:`confluent_header`).
``cdc.outbox.emit`` encodes the same way before it writes a row, and ``cdc dlq replay`` before it publishes.

JSON to Avro mapping (the README's table, with examples). Validation is strict: nothing is coerced, every
mismatch is a PayloadInvalidError.

- null: only ``null``. boolean: only ``true`` / ``false``. string: only strings.
- int / long: JSON integers in the signed 32 / 64-bit range; not booleans, not numbers with a fraction or
  an exponent (``1.0`` fails; orjson reads integers beyond 64 bits as floats, so those fail too).
- float / double: any JSON number; float rejects magnitudes above 3.4e38 (they would become infinity).
- bytes / fixed: a string in the ``cdc.encoding`` of the type or of its field: ``latin1`` (the default:
  code points U+0000..U+00FF, one byte each, as in Avro's JSON encoding), ``base64`` (RFC 4648, padded, line
  breaks allowed: PostgreSQL's ``encode(b, 'base64')``) or ``hex`` (``\\x0a1b``, a bytea column's text as
  ``jsonb_build_object`` writes it, or ``0a1b``); fixed needs exactly ``size`` bytes.
- enum: one of its symbols.
- array: a JSON array; map: a JSON object; items and values are checked one by one.
- record: a JSON object. Fields without a default must be present; a field with a default may be left out
  (the default is written), but ``null`` does not mean "left out". Keys that are not fields are an error.
- union: a plain JSON value (not the Avro-JSON ``{"type": value}`` tag), written with the first branch in
  schema order that accepts it: ``["int", "long"]`` writes 5 as int and 2**40 as long.
- logical types (:mod:`cdc.avro.logical`): decimal takes a JSON number or a decimal string, read exactly
  (a schema with a decimal is parsed with ``parse_float=Decimal``; others with orjson) and refused when the
  scale or the precision cannot hold it (never rounded), or, with a ``cdc.encoding``, its two's-complement
  bytes; timestamp-millis/micros take an integer or ISO-8601 with a UTC offset, local-timestamp-* one
  without, date ``YYYY-MM-DD``, time-millis/micros ``HH:MM:SS[.ffffff]``, each refused when more precise than
  its unit (never truncated); uuid a UUID string, on a fixed(16) that or its 16 bytes. A logical type on
  another Avro type, or another logical type, is its Avro type. Defaults are Avro's JSON encoding only.

Errors name the event type, version, field path (``items[2].quantity``; map values by position,
``attrs{#0}``, as map keys are data) and JSON types, never a payload value; an unknown key is named only if it
is an Avro name. A schema the store refuses, or with a default that does not fit its field, is a
SchemaNotFoundError: the event goes to the DLQ (``schema_not_found``) and the stream goes on.

Each schema is compiled once into straight-line Python that validates and writes in one pass
(:mod:`cdc.avro.codegen`, which says why a schema file can never become code).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import orjson

from cdc import fastpath
from cdc.avro import compiled
from cdc.avro.codegen import EncodeFn, build
from cdc.avro.kinds import BadSchema, check_schema
from cdc.avro.runtime import Invalid
from cdc.avro.store import SchemaStore
from cdc.errors import PayloadInvalidError, SchemaNotFoundError

__all__ = ["CONFLUENT_MAGIC", "MAGIC", "AvroEncoder", "Payload", "confluent_header", "split_confluent"]

MAGIC: Final = b"\xc3\x01"  # the marker of Avro single-object encoding
CONFLUENT_MAGIC: Final = b"\x00"  # the Confluent wire format: this byte, the 4-byte schema id, the body

Payload = bytes | bytearray | memoryview | str
_Compiled = tuple[bytes, EncodeFn, str, Callable[[Payload], Any]]  # header, encoder, "<type> v<N>", parser


def confluent_header(schema_id: int) -> bytes:
    """The prefix of a Confluent-framed value (ids come from the registry: :mod:`cdc.avro.registry`)."""
    return CONFLUENT_MAGIC + struct.pack(">I", schema_id)


def split_confluent(value: bytes) -> tuple[int, memoryview]:
    """``(schema id, body)`` of a Confluent-framed value; ValueError when it is not one."""
    if len(value) < 5 or value[0] != 0:
        raise ValueError("not Confluent-framed (magic byte 0 + 4-byte schema id)")
    schema_id: int = struct.unpack_from(">I", value, 1)[0]
    return schema_id, memoryview(value)[5:]


class AvroEncoder:
    """JSON payload -> Avro, strictly validated (module docstring); one compiled encoder per schema."""

    def __init__(self, store: SchemaStore, *, compiled: bool = True) -> None:
        """``compiled``: :meth:`encoder_for` hands out the compiled encoder (:mod:`cdc.avro.compiled`)
        where the extension is built and takes the schema; the Python one otherwise."""
        self.store = store
        self.compiled = compiled and fastpath.available()
        self._compiled: dict[tuple[str, int], _Compiled] = {}
        self._programs: dict[tuple[str, int], tuple[Any, ...] | None] = {}  # for the compiled encoder

    def encode(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """Single-object encoding ``C3 01`` + fingerprint + body; SchemaNotFoundError, PayloadInvalidError."""
        key = (event_type, schema_version)
        header, fn, what, loads = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, loads, payload, bytearray(header))

    def encoder_for(
        self, event_type: str, schema_version: int, *, header: bytes | None = None
    ) -> Callable[[Payload], bytes]:
        """``encode`` bound to one schema, for callers that route many events of the same type: the
        per-event cost is then the parse, the validation and the writing alone. ``header`` replaces the
        single-object prefix (Confluent framing: ``00`` + schema id)."""
        single_object, fn, what, loads = self._compiled.get((event_type, schema_version)) or self._compile(
            (event_type, schema_version)
        )
        header = single_object if header is None else header

        def encode(payload: Payload) -> bytes:
            return _run(fn, what, loads, payload, bytearray(header))

        if self.compiled:
            key = (event_type, schema_version)
            if key not in self._programs:
                self._programs[key] = compiled.program(self.store.get(*key).parsed)
            fast = compiled.encoder(header, self._programs[key], encode)
            if fast is not None:
                return fast
        return encode

    def encode_body(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """The bare Avro binary body, for other framings (Confluent: ``00`` + schema id + body)."""
        key = (event_type, schema_version)
        _, fn, what, loads = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, loads, payload, bytearray())

    def reads_exactly(self, event_type: str, schema_version: int) -> bool:
        """Whether payloads of this schema are parsed exactly (it has a decimal), so that a caller holding
        the payload's text must hand over that text, not a float's rendering of it. False for a schema that
        cannot be used: encoding then fails with the reason."""
        key = (event_type, schema_version)
        try:
            entry = self._compiled.get(key) or self._compile(key)
        except SchemaNotFoundError:
            return False
        return entry[3] is not _LOADS

    def _compile(self, key: tuple[str, int]) -> _Compiled:
        stored = self.store.get(*key)
        what = f"{stored.event_type} v{stored.version}"
        try:
            check_schema(stored.parsed, "", set())
        except BadSchema as exc:
            raise SchemaNotFoundError(
                f"schema for {what} in {stored.path} is not valid Avro: {exc}"
            ) from None
        try:
            fn, exact = build(stored.parsed, stored.parsed.get("__named_schemas", {}), {}, set())
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {stored.path} cannot be used: {exc}") from exc
        entry = self._compiled[key] = (
            MAGIC + stored.fingerprint,
            fn,
            what,
            _loads_exact if exact else _LOADS,
        )
        return entry


_LOADS: Final = orjson.loads
# The numbers of a schema with a decimal: a float would round 0.1 and every amount beyond 15 digits. Only such
# schemas pay for the standard library's parser (several times orjson's time).
_EXACT: Final = json.JSONDecoder(parse_float=Decimal, parse_constant=lambda name: _not_json(name))


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def _loads_exact(payload: Payload) -> Any:
    text = payload if isinstance(payload, str) else bytes(payload).decode()
    return _EXACT.decode(text)


def _run(fn: EncodeFn, what: str, loads: Callable[[Payload], Any], payload: Payload, out: bytearray) -> bytes:
    try:
        value = loads(payload)
    except UnicodeDecodeError:  # its text quotes the byte
        raise PayloadInvalidError(f"{what}: payload is not valid UTF-8") from None
    except (
        ValueError
    ) as exc:  # orjson's and json's errors: a reason and a position, never a quote of the input
        raise PayloadInvalidError(f"{what}: payload is not valid JSON: {exc}") from exc
    except RecursionError:
        raise PayloadInvalidError(f"{what}: payload is nested too deeply to parse") from None
    try:
        fn(value, out)
    except Invalid as exc:
        raise PayloadInvalidError(f"{what}: {exc.render()}") from None
    except RecursionError:
        raise PayloadInvalidError(f"{what}: payload is nested too deeply to encode") from None
    except UnicodeEncodeError:  # a lone surrogate escape, which json (not orjson, nor jsonb) lets through
        raise PayloadInvalidError(f"{what}: payload has a string that is not Unicode") from None
    return bytes(out)
