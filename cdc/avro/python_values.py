"""Python values and the payload's JSON: what ``cdc.outbox.emit`` writes, and what a consumer gets back.

Writing (:func:`payload_json`): orjson already writes ``datetime`` (ISO-8601, with its UTC offset when it has
one, without when it is naive: a timestamp-* field needs an aware one, a local-timestamp-* field a naive one),
``date``, ``time`` and ``UUID`` in the forms that :mod:`cdc.avro.logical` reads. A ``Decimal`` becomes a
JSON number with its exact digits (PostgreSQL's jsonb keeps them: it stores numbers as numeric). ``bytes``,
``bytearray`` and ``memoryview`` become a string in the ``cdc.encoding`` of the field they are in, so those
alone need the schema: a payload without them is serialized in one orjson call.

Reading (:func:`python_values`): fastavro already returns ``Decimal``, ``datetime`` (aware, UTC, for
timestamp-*; naive for local-timestamp-*), ``date``, ``time`` and ``UUID`` for a uuid string; a uuid on a
fixed(16) it returns as 16 bytes, which this turns into a ``UUID``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from cdc.avro.kinds import resolve
from cdc.avro.logical import ENCODING
from cdc.avro.runtime import Invalid
from cdc.errors import PayloadInvalidError

__all__ = ["has_fixed_uuid", "payload_json", "python_values"]

_BYTES = (bytes, bytearray, memoryview)
Path = tuple[object, ...]


class _NeedsSchema(Exception):  # a bytes value: its JSON form is its field's
    pass


def _plain(value: object) -> object:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise TypeError("a Decimal NaN or Infinity has no JSON form")
        return orjson.Fragment(str(value).encode())  # "-12.50", "1E+3": JSON numbers, every digit kept
    if isinstance(value, _BYTES):
        raise _NeedsSchema
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def payload_json(schema: Any, payload: Any, what: str) -> bytes:
    """The JSON of ``payload`` (Python values) for a row of ``schema`` (fastavro's parsed form), ``what``
    naming it in errors ("OrderPlaced v1"); PayloadInvalidError for a value that has no JSON form there."""
    try:
        try:
            return orjson.dumps(payload, default=_plain)
        except orjson.JSONEncodeError as exc:
            if not isinstance(exc.__cause__, _NeedsSchema):
                raise
        named = schema.get("__named_schemas", {})
        return orjson.dumps(_with_bytes(schema, named, payload, None, ()), default=_plain)
    except Invalid as exc:
        raise PayloadInvalidError(f"{what}: {exc.render()}") from None
    except orjson.JSONEncodeError as exc:  # its text names a type, never a value
        raise PayloadInvalidError(f"{what}: payload has a value without a JSON form: {exc}") from None


def _with_bytes(schema: Any, named: dict[str, Any], value: Any, enc: str | None, path: Path) -> Any:
    """``value`` with its bytes turned into strings in their field's encoding; ``enc`` is the enclosing
    field's ``cdc.encoding``."""
    kind, s = resolve(schema, named, False)
    if isinstance(s, dict):
        enc = s.get(ENCODING) or enc
    if kind == "union":
        branch = _branch(s, named, value)
        return value if branch is None else _with_bytes(branch, named, value, enc, path)
    if isinstance(value, _BYTES):
        return _bytes_form(kind, s, bytes(value), enc, path)
    if kind in ("record", "error") and isinstance(value, Mapping):
        fields = {f["name"]: f for f in s["fields"]}
        return {
            k: _with_bytes(fields[k]["type"], named, v, fields[k].get(ENCODING), (*path, k))
            if k in fields
            else v
            for k, v in value.items()
        }
    if kind == "array" and isinstance(value, list | tuple):
        return [_with_bytes(s["items"], named, v, enc, (*path, i)) for i, v in enumerate(value)]
    if kind == "map" and isinstance(value, Mapping):
        return {
            k: _with_bytes(s["values"], named, v, enc, (*path, f"{{#{i}}}"))
            for i, (k, v) in enumerate(value.items())
        }
    return value


def _branch(branches: list[Any], named: dict[str, Any], value: Any) -> Any:
    """The union branch a Python value belongs to, as far as its bytes are concerned (None: no matter): the
    first that can hold it; for a mapping, a record that has all its keys first, then a map, then a record."""
    found: list[tuple[int, Any]] = []
    for branch in branches:
        kind, s = resolve(branch, named, False)
        if isinstance(value, _BYTES):
            size = s.get("size") if s.get("type") == "fixed" else None
            if kind in ("bytes", "fixed", "uuid-fixed", "decimal") and size in (None, len(value)):
                return branch
        elif isinstance(value, Mapping) and kind in ("record", "error"):
            found.append((0 if set(value) <= {f["name"] for f in s["fields"]} else 2, branch))
        elif isinstance(value, Mapping) and kind == "map":
            found.append((1, branch))
        elif isinstance(value, list | tuple) and kind == "array":
            return branch
    return min(found, key=lambda rank_branch: rank_branch[0])[1] if found else None


def _bytes_form(kind: str, s: Any, raw: bytes, enc: str | None, path: Path) -> str:
    if kind == "uuid-fixed" and len(raw) == 16:
        return str(uuid.UUID(bytes=raw))
    if kind not in ("bytes", "fixed", "decimal"):
        raise Invalid(path, f"expects {kind}, got bytes")
    if kind == "decimal" and enc is None:
        raise Invalid(
            path,
            f"expects a decimal: a Decimal or an int (two's-complement bytes need the field's {ENCODING})",
        )
    if enc == "base64":
        return base64.b64encode(raw).decode()
    if enc == "hex":
        return raw.hex()
    if 0 in raw:
        raise Invalid(
            path,
            "has a zero byte, which a jsonb payload cannot carry as latin1 (PostgreSQL refuses \\u0000): "
            f'give the field "{ENCODING}": "base64"',
        )
    return raw.decode("latin-1")


def has_fixed_uuid(schema: Any) -> bool:
    """Whether ``schema`` has a uuid on a fixed(16), which :func:`python_values` turns into UUIDs."""
    named, seen = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}, set[int]()

    def walk(node: Any) -> bool:
        kind, s = resolve(node, named, False)
        if id(s) in seen:
            return False
        seen.add(id(s))
        if kind == "uuid-fixed":
            return True
        if kind == "union":
            return any(map(walk, s))
        if kind in ("record", "error"):
            return any(walk(f["type"]) for f in s["fields"])
        return (kind == "array" and walk(s["items"])) or (kind == "map" and walk(s["values"]))

    return walk(schema)


def python_values(schema: Any, value: Any) -> Any:
    """``value`` as fastavro read it with ``schema``, its fixed(16) uuids as UUIDs (only the schemas for
    which :func:`has_fixed_uuid` is true need it)."""
    named = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}

    def convert(node: Any, v: Any) -> Any:
        kind, s = resolve(node, named, False)
        if kind == "uuid-fixed":
            return uuid.UUID(bytes=bytes(v)) if isinstance(v, bytes) and len(v) == 16 else v
        if kind == "union":
            if isinstance(v, bytes) and len(v) == 16:
                kinds = [resolve(b, named, False)[0] for b in s]
                return uuid.UUID(bytes=v) if "uuid-fixed" in kinds else v
            branch = _branch(s, named, v)
            return v if branch is None else convert(branch, v)
        if kind in ("record", "error") and isinstance(v, dict):
            types = {f["name"]: f["type"] for f in s["fields"]}
            return {k: convert(types[k], x) if k in types else x for k, x in v.items()}
        if kind == "array" and isinstance(v, list):
            return [convert(s["items"], x) for x in v]
        if kind == "map" and isinstance(v, dict):
            return {k: convert(s["values"], x) for k, x in v.items()}
        return v

    return convert(schema, value)
