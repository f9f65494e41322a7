"""Does a field's default fit its type? Avro's JSON encoding of defaults, as Java reads it, and the default
as the encoder is to see it (the keys of a record default that are no fields of the record left out).

Used by :mod:`cdc.avro.validate` once every name of the schema is known: it hands over how a type resolves
(``target``: kind, definition and namespace of a validated type). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

_INT: Final = (-(2**31), 2**31 - 1)
_LONG: Final = (-(2**63), 2**63 - 1)
Target = Callable[[Any, str], tuple[str, Any, str]]


def shown_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:60] + "...'"


def json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}.get(
        type(value), type(value).__name__
    )


@dataclass
class DefaultField:
    """A field whose default is checked once every name is known."""

    path: str
    type: Any
    namespace: str
    default: Any
    holder: dict[str, Any]


def _latin1(v: Any) -> bool:
    return isinstance(v, str) and all(ord(c) < 256 for c in v)


def _number(v: Any) -> bool:
    return type(v) is int or type(v) is float


_SCALARS: Final[dict[str, tuple[str, Callable[[Any], bool]]]] = {  # kind: (what a default must be, test)
    "null": ("null", lambda v: v is None),
    "boolean": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer of 32 bits", lambda v: type(v) is int and _INT[0] <= v <= _INT[1]),
    "long": ("an integer of 64 bits", lambda v: type(v) is int and _LONG[0] <= v <= _LONG[1]),
    # Java also takes a string that Double.parseDouble reads ("NaN", "1.5"), which is not a JSON number.
    "float": ("a number", _number),
    "double": ("a number", _number),
    # Java takes any string for bytes; Avro's JSON maps code points 0-255 to bytes, and no others.
    "bytes": ("a string of code points U+0000..U+00FF", _latin1),
    "string": ("a string", lambda v: isinstance(v, str)),
}


class DefaultFit:
    """``misfit`` and ``prune`` over the types of one schema, resolved by ``target``."""

    def __init__(self, target: Target) -> None:
        self._target = target

    def misfit(self, t: Any, ns: str, v: Any) -> str | None:
        """Why ``v`` is not a value of ``t`` (None when it is), in the terms of a JSON default."""
        kind, s, ns = self._target(t, ns)
        if kind in _SCALARS:
            want, test = _SCALARS[kind]
            return None if test(v) else f"expected {want}, got {json_kind(v)}"
        if kind == "enum":
            # Java takes any string (docs/schema-checks.md): only a symbol can be written.
            ok = isinstance(v, str) and v in s["symbols"]
            return None if ok else f"expected one of the enum's symbols, got {json_kind(v)}"
        if kind == "fixed":
            ok = _latin1(v) and len(v) == s["size"]  # Java takes any string
            return None if ok else f"expected {s['size']} code points U+0000..U+00FF, got {json_kind(v)}"
        if kind == "union":  # any branch: the specification since Avro 1.12 (AVRO-3649), and Java
            if any(self.misfit(b, ns, v) is None for b in s):
                return None
            return f"{json_kind(v)} fits none of the union's branches"
        if kind == "array":
            if not isinstance(v, list):
                return f"expected an array, got {json_kind(v)}"
            return next(
                (f"item {i}: {p}" for i, x in enumerate(v) if (p := self.misfit(s["items"], ns, x))), None
            )
        if kind == "map":
            if not isinstance(v, dict):
                return f"expected an object, got {json_kind(v)}"
            return next((f"a value: {p}" for x in v.values() if (p := self.misfit(s["values"], ns, x))), None)
        if not isinstance(v, dict):
            return f"expected an object (a record), got {json_kind(v)}"
        for f in s["fields"]:
            if f["name"] in v:
                if (p := self.misfit(f["type"], ns, v[f["name"]])) is not None:
                    return f"field {shown_value(f['name'])}: {p}"
            elif "default" not in f:
                return f"field {shown_value(f['name'])} is missing and has no default"
        return None

    def prune(self, t: Any, ns: str, v: Any) -> Any:
        """``v`` without the keys of record values that are not fields (Java ignores them)."""
        kind, s, ns = self._target(t, ns)
        if kind == "union":
            branch = next(b for b in s if self.misfit(b, ns, v) is None)
            return self.prune(branch, ns, v)
        if kind == "array":
            return [self.prune(s["items"], ns, x) for x in v]
        if kind == "map":
            return {k: self.prune(s["values"], ns, x) for k, x in v.items()}
        if kind in ("record", "error"):
            return {f["name"]: self.prune(f["type"], ns, v[f["name"]]) for f in s["fields"] if f["name"] in v}
        return v
