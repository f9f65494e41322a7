"""What the encoder's generator reads of a schema: the kind of each node, and the attributes it relies on.

:func:`resolve` says what a node of fastavro's parsed form is (a name, a primitive, ``{"type": ...}`` or a
union), a logical type the encoder reads having a kind of its own (``decimal``, ``timestamp-millis``...,
``uuid-fixed``); :mod:`cdc.avro.codegen` and :mod:`cdc.avro.python_values` walk schemas with it.
:func:`check_schema` type-checks every attribute the generator reads before it reads them (a schema file is
data from a pull request): :mod:`cdc.avro.encoder` turns a :class:`BadSchema` into a SchemaNotFoundError.
"""

from __future__ import annotations

import re
from typing import Any, Final

from cdc.avro.logical import ENCODING, ENCODINGS, TIME_KINDS
from cdc.avro.runtime import DISPATCH
from cdc.avro.store import AVRO_NAME

__all__ = ["AVRO_KINDS", "LOGICAL", "PRIMITIVE", "BadSchema", "check_schema", "resolve"]

_FULLNAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

PRIMITIVE: Final = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
AVRO_KINDS: Final = PRIMITIVE | {"record", "error", "enum", "fixed", "array", "map"}
# (Avro type, logicalType): the kind of a logical type the encoder reads. Logical types on other types are
# ignored, as the specification says; with ``strict`` (defaults, which are Avro's JSON encoding) all are.
LOGICAL: Final = {
    ("bytes", "decimal"): "decimal",
    ("fixed", "decimal"): "decimal",
    ("string", "uuid"): "uuid",
    ("fixed", "uuid"): "uuid-fixed",
    **{(avro_type, name): name for name, (avro_type, _) in TIME_KINDS.items()},
}


def resolve(schema: Any, named: dict[str, Any], strict: bool) -> tuple[str, Any]:
    """``(kind, schema)`` for any schema form: a name, a primitive, ``{"type": ...}`` or a union (a list). The
    kind of a logical type the generator reads is its own (``decimal``, ``timestamp-millis``...)."""
    while not isinstance(schema, list):
        if isinstance(schema, str):
            schema = {"type": schema} if schema in PRIMITIVE else named[schema]
        kind = schema["type"]
        if isinstance(kind, str) and kind in AVRO_KINDS:
            logical = schema.get("logicalType")
            if not strict and type(logical) is str and (own := LOGICAL.get((kind, logical))):
                if own != "uuid-fixed" or schema.get("size") == 16:  # uuid annotates a fixed(16) only
                    return own, schema
            return kind, schema
        schema = kind
    return "union", schema


class BadSchema(ValueError):  # an attribute the generator reads has the wrong type or form
    pass


def _json_type(value: object) -> str:
    return DISPATCH.get(type(value).__name__, "object")


def _what(value: object) -> str:  # what a value that is not a name is, without its text
    return "string that is not one" if isinstance(value, str) else _json_type(value)


def check_schema(schema: Any, at: str, seen: set[int]) -> None:
    """Everything of ``schema`` (fastavro's parsed form) the generator reads, type-checked: fastavro accepts a
    fixed's size of any type and names of any text. ``at`` is the attribute path; the message names it, never
    the attribute's text, which may be anything."""
    if isinstance(schema, list):
        for i, branch in enumerate(schema):
            check_schema(branch, f"{at}[{i}]", seen)
        return
    if not isinstance(schema, dict) or id(schema) in seen:
        return  # a primitive or a named type's name: fastavro resolved it; a definition is checked once
    seen.add(id(schema))
    kind, dot = schema.get("type"), f"{at}." if at else ""
    if not isinstance(kind, str):
        return check_schema(kind, f"{dot}type", seen)
    if kind in ("record", "error", "enum", "fixed"):
        name = schema.get("name")
        if not (isinstance(name, str) and _FULLNAME.match(name)):
            raise BadSchema(
                f"{dot}name of a {kind} must be a dot-separated Avro name ([A-Za-z_][A-Za-z0-9_]* each, "
                f"namespace included), got {_what(name)}"
            )
    if kind in ("record", "error"):
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise BadSchema(f"{dot}fields must be an array, got {_json_type(fields)}")
        names: set[str] = set()
        for i, f in enumerate(fields):
            fname = f.get("name") if isinstance(f, dict) else None
            if not (isinstance(fname, str) and AVRO_NAME.match(fname)):
                raise BadSchema(
                    f"{dot}fields[{i}].name must be an Avro name ([A-Za-z_][A-Za-z0-9_]*), got {_what(fname)}"
                )
            if fname in names:
                raise BadSchema(f"{dot}fields[{i}].name {fname!r} is the name of an earlier field")
            names.add(fname)
            if ENCODING in f:
                _check_encoding(f[ENCODING], f"{dot}fields[{i}]")
                if not _may_hold_bytes(f["type"]):
                    raise BadSchema(
                        f"{dot}fields[{i}].{ENCODING} is for bytes and fixed; the field holds none"
                    )
            check_schema(f["type"], f"{dot}fields[{i}].type", seen)
    elif kind == "enum":
        symbols = schema.get("symbols")
        names_ok = isinstance(symbols, list) and all(
            isinstance(v, str) and AVRO_NAME.match(v) for v in symbols
        )
        if not names_ok:
            raise BadSchema(f"{dot}symbols must be an array of Avro names, got {_json_type(symbols)}")
    elif kind == "fixed":
        size = schema.get("size")
        if type(size) is not int or size < 0:
            got = "integer below 0" if type(size) is int else _json_type(size)
            raise BadSchema(f"{dot}size must be an integer >= 0, got {got}")
    elif kind == "array":
        check_schema(schema.get("items"), f"{dot}items", seen)
    elif kind == "map":
        check_schema(schema.get("values"), f"{dot}values", seen)
    _check_logical(schema, kind, dot)


def _check_encoding(value: object, at: str) -> None:
    if not (isinstance(value, str) and value in ENCODINGS):
        raise BadSchema(f"{at}.{ENCODING} must be one of {', '.join(ENCODINGS)}, got {_what(value)}")


def _may_hold_bytes(schema: Any) -> bool:
    """Whether a field's type has a bytes or fixed, outside records: a name counts (it may be a fixed)."""
    if isinstance(schema, list):
        return any(map(_may_hold_bytes, schema))
    if isinstance(schema, str):
        return schema not in PRIMITIVE or schema == "bytes"
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "array":
        return _may_hold_bytes(schema.get("items"))
    if kind == "map":
        return _may_hold_bytes(schema.get("values"))
    return kind in ("bytes", "fixed") or not isinstance(kind, str) and _may_hold_bytes(kind)


def _check_logical(schema: dict[str, Any], kind: str, dot: str) -> None:
    """The cdc.encoding of a type. (A decimal whose precision or scale the specification calls invalid never
    gets here: cdc.avro.validate drops it, and the field is its bytes or fixed, as Avro says.)"""
    if ENCODING in schema:
        if kind not in ("bytes", "fixed"):
            raise BadSchema(f"{dot}{ENCODING} is for bytes and fixed types, not {kind}")
        _check_encoding(schema[ENCODING], dot.rstrip(".") or "schema")
