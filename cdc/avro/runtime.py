"""What the encoders compiled by :mod:`cdc.avro.codegen` call at run time: varints, floats, and the errors.

The generated code sees these under the names of :data:`RUNTIME` (``_VI``, ``_bad``...) in its namespace, and
nothing else from this package. :class:`Invalid` is the one exception it raises: :mod:`cdc.avro.encoder`
turns it into a PayloadInvalidError that names the field path, never a payload value.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any, Final

from cdc.avro.store import AVRO_NAME

__all__ = ["DISPATCH", "RUNTIME", "VI", "Invalid", "bad", "unknown"]

DISPATCH: Final = {  # Python type name of a JSON value: its JSON name. Unions test the types in this order.
    "str": "string",
    "dict": "object",
    "int": "integer",
    "NoneType": "null",
    "float": "number",
    "list": "array",
    "bool": "boolean",
    "Decimal": "number",  # the numbers of a schema with a decimal, which are parsed exactly
}


class Invalid(Exception):
    def __init__(self, path: tuple[object, ...], problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = path, problem

    def render(self, whole: str = "payload") -> str:  # path: field names, array indexes, map positions "{#N}"
        text = "".join(f"[{p}]" if type(p) is int else f".{p}".replace(".{", "{") for p in self.path)
        return f"field '{text.lstrip('.')}' {self.problem}" if self.path else f"{whole} {self.problem}"


def bad(path: tuple[object, ...], expected: str, value: object, ranged: tuple[type, ...] = ()) -> Invalid:
    """``value`` does not fit; when its type is in ``ranged``, the type was right but the number too large."""
    got = DISPATCH.get(type(value).__name__, "object") + (" out of range" if type(value) in ranged else "")
    return Invalid(path, f"expects {expected}, got {got}")


def unknown(path: tuple[object, ...], value: dict[str, object], known: frozenset[str]) -> Invalid:
    extra = [k for k in value if k not in known]
    if extra and AVRO_NAME.match(extra[0]) and len(extra[0]) <= 64:
        return Invalid((*path, extra[0]), f"is not in the schema ({len(extra)} unknown field(s))")
    return Invalid(path, f"has {len(extra)} unknown field(s) (names not shown: not valid Avro names)")


VI: Final = [bytes((z,) if z < 128 else ((z & 0x7F) | 0x80, z >> 7)) for z in range(1 << 14)]  # a varint
VC: Final = [bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)]  # 14 bits, more to come


def varint(z: int) -> bytes:
    return VC[z & 0x3FFF] + varint(z >> 14) if z >= 1 << 14 else VI[z]


# The generated code's names for the helpers above.
RUNTIME: Final[dict[str, Any]] = {
    "_VI": VI,
    "_VC": VC,
    "_varint": varint,
    "_Invalid": Invalid,
    "_bad": bad,
    "_unknown": unknown,
    "_pf": struct.Struct("<f").pack,
    "_pd": struct.Struct("<d").pack,
    "_Dec": Decimal,
    "_inf": math.inf,
}
