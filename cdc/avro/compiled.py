"""The compiled Avro encoder (``cdc._fastpath``, Rust): when it is used, and the schema as its program.

The encoder of :mod:`cdc.avro.codegen` is the reference: it defines what a payload becomes and every error.
The compiled one scans the JSON once and writes the Avro as it reads (no tree of Python objects): about a
seventh of the reference's cost for the common payload. It is only ever right or absent: for any payload it is
not sure the reference would write identically (a type mismatch, an unknown or repeated key, a number out of
range, an escape it does not take...), it calls the reference, which writes the value or raises its error.
``tests/unit/avro/test_compiled.py`` holds it to the reference byte for byte.

The schema is handed over as a *program*: nested tuples made here from the same parsed schema, with the
reference's own resolution (:func:`cdc.avro.kinds.resolve`), its union dispatch order
(:data:`cdc.avro.runtime.DISPATCH`) and its own bytes for field defaults. No schema text becomes code. A
schema with a part the compiled encoder does not take (decimal and uuid, a ``cdc.encoding`` other than latin1,
maps, recursive records, a union where one JSON type fits two branches, a record of more than 32 fields) keeps
the reference encoder as a whole.

Whether it is used: :mod:`cdc.fastpath` (the setting ``fast_path``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cdc import fastpath
from cdc.avro.codegen import _ACCEPTS, build
from cdc.avro.kinds import resolve
from cdc.avro.logical import ENCODING, TIME_KINDS
from cdc.avro.runtime import DISPATCH, VI

__all__ = ["encoder", "program"]

MAX_FIELDS: Final = 32  # the compiled record tracks its fields in a 32-bit set

_PLAIN: Final = {"null", "boolean", "int", "long", "float", "double", "string"}


def encoder(
    header: bytes, prog: tuple[Any, ...] | None, reference: Callable[[Any], bytes]
) -> Callable[[Any], bytes] | None:
    """``reference`` made faster: the compiled encoder of the :func:`program` ``prog``, falling back on
    ``reference``; None when the extension is missing or the schema has no program."""
    if fastpath.extension is None or prog is None:
        return None
    fast: Callable[[Any], bytes] = fastpath.extension.Encoder(header, prog, reference)
    return fast


class _Unsupported(Exception):
    pass


def program(parsed: Any) -> tuple[Any, ...] | None:
    """The compiled encoder's program for a parsed schema (fastavro's form, as the store keeps it), or None
    when the schema has a part only the reference encodes."""
    named = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}
    try:
        return _node(parsed, named, frozenset(), None)
    except _Unsupported:
        return None


def _node(schema: Any, named: dict[str, Any], active: frozenset[str], enc: str | None) -> tuple[Any, ...]:
    kind, s = resolve(schema, named, False)
    if isinstance(s, dict):
        enc = s.get(ENCODING) or enc
    if kind in _PLAIN:
        return (kind,)
    if kind in TIME_KINDS:
        # An integer is written as the int or long it is; a string (ISO 8601) is not the compiled
        # encoder's to read: it hands such a payload to the reference.
        return (TIME_KINDS[kind][0],)
    if kind in ("bytes", "fixed"):
        if enc not in (None, "latin1"):
            raise _Unsupported(f"cdc.encoding {enc}")
        return ("bytes",) if kind == "bytes" else ("fixed", s["size"])
    if kind == "enum":
        return ("enum", [(symbol, VI[i << 1]) for i, symbol in enumerate(s["symbols"])])
    if kind == "array":
        return ("array", _node(s["items"], named, active, enc))
    if kind in ("record", "error"):
        if s["name"] in active or len(s["fields"]) > MAX_FIELDS:
            raise _Unsupported("a recursive or wide record")
        active = active | {s["name"]}
        fields = []
        for f in s["fields"]:
            default = None
            if "default" in f:
                out = bytearray()
                fn, _ = build(f["type"], named, {}, set(), strict=True)
                fn(f["default"], out)
                default = bytes(out)
            fields.append((f["name"], _node(f["type"], named, active, f.get(ENCODING)), default))
        return ("record", fields)
    if kind == "union":
        kinds = [resolve(branch, named, False)[0] for branch in s]
        branches = []
        for pytype in DISPATCH:
            fits = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS.get(k, "").split()]
            if len(fits) > 1:
                raise _Unsupported("a JSON type fits several branches")
            if fits and pytype != "Decimal":
                branches.append((pytype, VI[fits[0] << 1], _node(s[fits[0]], named, active, enc)))
        return ("union", branches)
    raise _Unsupported(kind)  # maps, decimal, uuid
