"""Is a schema valid Avro? The one check every way in takes, and what Avro makes of the schema.

:func:`validate_schema` is called on every schema the project loads: by :class:`~cdc.avro.store.SchemaStore`
(so by ``cdc schemas check``, ``cdc schemas register`` and ``cdc run``, which checks every file before it
streams) and by :mod:`cdc.avro.resolution` before it compares two schemas. A schema passes when both the
Avro specification and Apache Avro's Java library (``Schema.Parser`` of 1.12, the parser of every JVM
consumer and of the Confluent and Apicurio registries) accept it; where the two differ, the stricter side is
taken, so that no consumer is handed a schema it cannot parse (docs/schema-checks.md lists those rules).

A refusal is an :class:`InvalidSchemaError` naming the JSON path of the culprit (``fields[2].type.size``),
the rule (``name``, ``duplicate-field``, ``union-duplicate``, ``fixed-size``, ``default``...) and why.

What Avro makes of a schema: a logical type that is invalid (a decimal whose scale exceeds its precision, a
``date`` on a string...) is ignored and the underlying type used, as the specification says and Java does;
keys of a record default that are not fields of the record are ignored, as Java does. The schema that
:func:`validate_schema` returns is a copy with both left out (so fastavro, which refuses some invalid
logical types, and the encoder see what Avro sees); the file's own text is what a registry gets.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

from cdc.avro.defaults import DefaultField, DefaultFit, json_kind, shown_value

__all__ = ["InvalidSchemaError", "valid_logical_type", "validate_schema"]

PRIMITIVES: Final = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED: Final = frozenset({"record", "error", "enum", "fixed"})
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # the specification's; Java takes any Unicode letter
_ORDERS: Final = frozenset({"ASCENDING", "DESCENDING", "IGNORE"})
_MAX_FIXED: Final = 2**31 - 1 - 8  # Java's limit on a byte array (SystemLimitException)


class InvalidSchemaError(ValueError):
    """The schema is not valid Avro: ``path`` (a JSON path, ``""`` for the whole schema) breaks ``rule``."""

    def __init__(self, path: str, rule: str, message: str, *, subject: str = "") -> None:
        # subject: the schema, when the caller knows it ("OrderPlaced v2").
        prefix = f"{subject} is not valid Avro " if subject else ""
        super().__init__(f"{prefix}at {path or 'the top level'}: {message} (rule: {rule})")
        self.path, self.rule, self.message = path, rule, message


_LOGICAL_TAKES: Final = {  # logical type: the types it may annotate (decimal is checked on its own)
    "uuid": ("string", "fixed"),
    "duration": ("fixed",),
    "big-decimal": ("bytes",),
    "date": ("int",),
    "time-millis": ("int",),
    **dict.fromkeys(["time-micros", "timestamp-millis", "timestamp-micros", "timestamp-nanos"], ("long",)),
    **dict.fromkeys(["local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos"], ("long",)),
}


def valid_logical_type(schema: dict[str, Any], kind: str, size: int = 0) -> bool:
    """Whether Java would take ``schema``'s logical type (an unknown one is not a valid logical type)."""
    logical = schema.get("logicalType")
    if logical == "decimal":
        precision, scale = schema.get("precision"), schema.get("scale", 0)
        if type(precision) is not int or type(scale) is not int or kind not in ("bytes", "fixed"):
            return False
        digits = 2**31 - 1 if kind == "bytes" else round(math.floor(math.log10(2) * (8 * size - 1)))
        return 0 < precision <= digits and 0 <= scale <= precision
    if not isinstance(logical, str) or kind not in _LOGICAL_TAKES.get(logical, ()):
        return False
    return kind != "fixed" or size == {"uuid": 16, "duration": 12}[logical]


class _Validator:
    def __init__(self) -> None:
        self.names: dict[str, dict[str, Any]] = {}  # full name -> definition (the copy being normalised)
        self.spaces: dict[int, str] = {}  # id of a definition -> the namespace its references resolve in
        self.full: dict[int, str] = {}  # id of a definition -> its full name
        self.defaults: list[DefaultField] = []
        self.fit = DefaultFit(self.target)

    def schema(self, s: Any, path: str, ns: str) -> Any:
        if isinstance(s, str):
            self.resolve(s, path, ns)
            return s
        if isinstance(s, list):
            return self.union(s, path, ns)
        if not isinstance(s, dict):
            raise InvalidSchemaError(
                path, "schema", f"a schema is a string, an object or an array, not {json_kind(s)}"
            )
        kind = s.get("type")
        at = f"{path}.type" if path else "type"
        if not isinstance(kind, str):
            what = (
                "has no 'type'"
                if "type" not in s
                else f"has {json_kind(kind)} for 'type', where a type name goes"
            )
            raise InvalidSchemaError(at, "type", f"a schema object {what}")
        if kind in NAMED:
            return self.named(kind, s, path, ns)
        out = dict(s)
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            if key not in s:
                raise InvalidSchemaError(path, "missing-attribute", f"an {kind} needs '{key}'")
            out[key] = self.schema(s[key], f"{path}.{key}" if path else key, ns)
        elif kind not in PRIMITIVES:  # {"type": "SomeName"}: a reference
            self.resolve(kind, at, ns)
            return out
        if "logicalType" in out and not valid_logical_type(out, kind):
            del out["logicalType"]
        return out

    def resolve(self, ref: str, path: str, ns: str) -> dict[str, Any] | str:
        if ref in PRIMITIVES:
            return ref
        full = ref if "." in ref or not ns else f"{ns}.{ref}"
        if full not in self.names:
            # Java also tries the null namespace for a relative name, and takes names defined further on; the
            # specification does neither (docs/schema-checks.md).
            raise InvalidSchemaError(
                path, "undefined-name", f"type {shown_value(ref)} is not defined before its use"
            )
        return self.names[full]

    def union(self, branches: list[Any], path: str, ns: str) -> list[Any]:
        out, seen = [], set[str]()
        for i, branch in enumerate(branches):
            at = f"{path}[{i}]"
            if isinstance(branch, list):
                raise InvalidSchemaError(at, "union-nested", "a union may not hold another union")
            done = self.schema(branch, at, ns)
            key = self.branch_key(done, ns)
            if key in seen:
                raise InvalidSchemaError(at, "union-duplicate", f"the union has two branches of type {key}")
            seen.add(key)
            out.append(done)
        return out

    def branch_key(self, s: Any, ns: str) -> str:
        """What makes a union's branch unique: its type, or for a named type its full name."""
        if isinstance(s, str):
            target = self.resolve(s, "", ns)
            return target if isinstance(target, str) else self.full[id(target)]
        kind = s["type"]
        if kind in NAMED:
            return self.full[id(s)]
        return kind if kind in PRIMITIVES or kind in ("array", "map") else self.branch_key(kind, ns)

    def named(self, kind: str, s: dict[str, Any], path: str, ns: str) -> dict[str, Any]:
        dot = f"{path}." if path else ""
        name = s.get("name")
        if not isinstance(name, str):
            raise InvalidSchemaError(
                f"{dot}name", "name", f"a {kind} needs a string 'name', not {json_kind(name)}"
            )
        space = s.get("namespace", ns)
        if "." in name:
            space, _, name = name.rpartition(".")
        elif not isinstance(space, str):
            raise InvalidSchemaError(
                f"{dot}namespace", "name", f"a namespace is a string, not {json_kind(space)}"
            )
        space = space or ""
        if not _NAME.match(name):
            raise InvalidSchemaError(
                f"{dot}name", "name", f"{shown_value(name)} is not an Avro name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if space and not all(_NAME.match(part) for part in space.split(".")):
            where = f"{dot}namespace" if "namespace" in s and "." not in str(s["name"]) else f"{dot}name"
            raise InvalidSchemaError(
                where,
                "name",
                f"namespace {shown_value(space)} is not a dotted Avro name "
                "(each part [A-Za-z_][A-Za-z0-9_]*)",
            )
        full = f"{space}.{name}" if space else name
        if not space and name in PRIMITIVES:
            raise InvalidSchemaError(f"{dot}name", "name", f"{shown_value(name)} is a primitive type's name")
        if full in self.names:
            # Java takes a second definition that equals the first; the specification takes none.
            raise InvalidSchemaError(
                f"{dot}name", "defined-once", f"type {shown_value(full)} is defined twice"
            )
        self.aliases(s, f"{dot}aliases", named=True)
        out = dict(s)
        self.names[full] = out  # defined from here on: a record's fields may refer to it
        self.spaces[id(out)] = space
        self.full[id(out)] = full
        if kind in ("record", "error"):
            self.fields(out, s, dot, space)
        elif kind == "enum":
            self.enum(s, dot)
        else:
            size = s.get("size")
            if type(size) is not int or not 0 <= size <= _MAX_FIXED:
                got = f"{size}" if type(size) is int else json_kind(size)
                raise InvalidSchemaError(
                    f"{dot}size", "fixed-size", f"a fixed's size is an integer >= 0, not {got}"
                )
        if "logicalType" in out and not valid_logical_type(out, kind, s.get("size", 0)):
            del out["logicalType"]
        return out

    def aliases(self, s: dict[str, Any], path: str, *, named: bool) -> None:
        if "aliases" not in s:
            return
        aliases = s["aliases"]
        if not isinstance(aliases, list):
            raise InvalidSchemaError(
                path, "alias", f"'aliases' is an array of strings, not {json_kind(aliases)}"
            )
        for i, alias in enumerate(aliases):
            if not isinstance(alias, str):
                raise InvalidSchemaError(
                    f"{path}[{i}]", "alias", f"an alias is a string, not {json_kind(alias)}"
                )
            # A type's alias is a name to Java (its last part is checked); the specification takes any string.
            if named and not _NAME.match(alias.rpartition(".")[2]):
                raise InvalidSchemaError(
                    f"{path}[{i}]", "alias", f"{shown_value(alias)} does not end in an Avro name"
                )

    def fields(self, out: dict[str, Any], s: dict[str, Any], dot: str, space: str) -> None:
        fields = s.get("fields")
        if not isinstance(fields, list):
            what = "has no 'fields'" if "fields" not in s else f"has {json_kind(fields)} for 'fields'"
            raise InvalidSchemaError(
                f"{dot}fields", "missing-attribute", f"a record {what}: it needs an array"
            )
        seen: set[str] = set()
        out["fields"] = []
        for i, f in enumerate(fields):
            at = f"{dot}fields[{i}]"
            if not isinstance(f, dict):
                raise InvalidSchemaError(at, "field", f"a field is an object, not {json_kind(f)}")
            name = f.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                got = shown_value(name) if isinstance(name, str) else json_kind(name)
                raise InvalidSchemaError(
                    f"{at}.name",
                    "name",
                    f"a field's name is an Avro name ([A-Za-z_][A-Za-z0-9_]*), not {got}",
                )
            if name in seen:
                raise InvalidSchemaError(
                    f"{at}.name", "duplicate-field", f"the record has two fields named {shown_value(name)}"
                )
            seen.add(name)
            if "type" not in f:
                raise InvalidSchemaError(at, "missing-attribute", f"field {shown_value(name)} has no 'type'")
            order = f.get("order", "ascending")
            if not isinstance(order, str) or order.upper() not in _ORDERS:
                raise InvalidSchemaError(
                    f"{at}.order", "order", "a field's order is ascending, descending or ignore"
                )
            self.aliases(f, f"{at}.aliases", named=False)
            field = dict(f)
            field["type"] = self.schema(f["type"], f"{at}.type", space)
            if "default" in f:
                self.defaults.append(DefaultField(f"{at}.default", field["type"], space, f["default"], field))
            out["fields"].append(field)

    def enum(self, s: dict[str, Any], dot: str) -> None:
        symbols = s.get("symbols")
        if not isinstance(symbols, list):
            raise InvalidSchemaError(
                f"{dot}symbols", "missing-attribute", "an enum needs an array of 'symbols'"
            )
        for i, symbol in enumerate(symbols):
            if not isinstance(symbol, str) or not _NAME.match(symbol):
                got = shown_value(symbol) if isinstance(symbol, str) else json_kind(symbol)
                raise InvalidSchemaError(
                    f"{dot}symbols[{i}]", "name", f"an enum symbol is an Avro name, not {got}"
                )
            if symbol in symbols[:i]:
                raise InvalidSchemaError(
                    f"{dot}symbols[{i}]", "duplicate-symbol", f"symbol {shown_value(symbol)} comes twice"
                )
        if "default" in s and s["default"] not in symbols:
            # Java treats a default that is not a string as no default: the specification wants a symbol.
            raise InvalidSchemaError(
                f"{dot}default", "enum-default", "an enum's default must be one of its symbols"
            )

    # -- defaults ----------------------------------------------------------------------------------------

    def check_defaults(self) -> None:
        for f in self.defaults:
            problem = self.fit.misfit(f.type, f.namespace, f.default)
            if problem is not None:
                raise InvalidSchemaError(
                    f.path, "default", f"the default does not fit the field's type: {problem}"
                )
            f.holder["default"] = self.fit.prune(f.type, f.namespace, f.default)

    def target(self, t: Any, ns: str) -> tuple[str, Any, str]:
        """``(kind, definition, namespace)`` of a validated type."""
        while True:
            if isinstance(t, list):
                return "union", t, ns
            if isinstance(t, str):
                found = self.resolve(t, "", ns)
                if isinstance(found, str):
                    return found, found, ns
                t = found
            kind = t["type"]
            if kind in NAMED or kind in PRIMITIVES or kind in ("array", "map"):
                return kind, t, self.spaces.get(id(t), ns)
            t = kind


def validate_schema(schema: Any) -> Any:
    """``schema`` as Avro reads it (module docstring), or :class:`InvalidSchemaError` if Avro refuses it."""
    validator = _Validator()
    try:
        out = validator.schema(schema, "", "")
        validator.check_defaults()
    except RecursionError:
        raise InvalidSchemaError("", "schema", "the schema is nested too deeply") from None
    return out
