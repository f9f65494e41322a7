"""A schema as the Rust prototype's program: nested tuples, or None when the compiled path does not take it.

Made from the same parsed schema (fastavro's form, from cdc.avro.store) that cdc.avro.codegen compiles, with
the same resolution (cdc.avro.kinds.resolve) and the same union dispatch order (cdc.avro.runtime.DISPATCH).
Defaults are encoded by the reference itself (codegen.build with strict=True, as codegen.record does), so the
compiled path writes the reference's bytes for them. Not taken (None, the reference path encodes): logical
types, a cdc.encoding other than latin1, unions where one JSON type fits several branches, recursive records.
"""

from __future__ import annotations

from typing import Any

from cdc.avro.codegen import _ACCEPTS, build
from cdc.avro.kinds import resolve
from cdc.avro.logical import ENCODING
from cdc.avro.runtime import DISPATCH, VI

PLAIN = {"null", "boolean", "int", "long", "float", "double", "string"}


class Unsupported(Exception):
    pass


def program(parsed: Any) -> tuple[Any, ...] | None:
    try:
        return _node(parsed, parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}, set(), None)
    except Unsupported:
        return None


def _node(schema: Any, named: dict[str, Any], active: set[str], enc: str | None) -> tuple[Any, ...]:
    kind, s = resolve(schema, named, False)
    if isinstance(s, dict):
        enc = s.get(ENCODING) or enc
    if kind in PLAIN:
        return (kind,)
    if kind in ("bytes", "fixed"):
        if enc not in (None, "latin1"):
            raise Unsupported(f"cdc.encoding {enc}")
        return ("bytes",) if kind == "bytes" else ("fixed", s["size"])
    if kind == "enum":
        return ("enum", [(sym, VI[i << 1]) for i, sym in enumerate(s["symbols"])])
    if kind == "array":
        return ("array", _node(s["items"], named, active, enc))
    if kind == "map":
        return ("map", _node(s["values"], named, active, enc))
    if kind in ("record", "error"):
        if s["name"] in active:
            raise Unsupported("recursive record")
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
        kinds = [resolve(b, named, False)[0] for b in s]
        branches = []
        for pytype in DISPATCH:
            cands = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS.get(k, "").split()]
            if len(cands) > 1:
                raise Unsupported("a JSON type fits several branches")
            if cands and pytype != "Decimal":
                branches.append((pytype, VI[cands[0] << 1], _node(s[cands[0]], named, active, enc)))
        return ("union", branches)
    raise Unsupported(kind)  # logical types
