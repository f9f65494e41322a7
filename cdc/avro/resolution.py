"""Avro schema resolution: can a reader schema read data written with a writer schema?

The checker under :mod:`cdc.avro.compat` (which applies it to versions, per compatibility mode); pure, no I/O.

The rules are those of the Avro 1.11 specification, section "Schema Resolution". Schemas are JSON-like Python
objects (what orjson loads from an ``.avsc``), normalised here: named types are resolved by fullname
(namespaces and dotted names as in the spec), so references and recursive types work. Non-union schemas match:

- primitives: the same type, or a promotion of the writer's: int to long, float or double; long to float or
  double; float to double; string to bytes; bytes to string. Logical types are their underlying type, as in
  the Java implementation's compatibility check, but for one rule of the specification that Java leaves
  out: two decimals match only if their precisions and scales do (``decimal-mismatch``).
- records: same unqualified name, or one of the reader's aliases is the writer's full name. An alias is
  resolved like a name, against the namespace of the type it is an alias of (``"c"`` of ``a.b`` is
  ``a.c``), and only the reader's aliases count. Fields are paired by name, or by a reader field's alias
  equal to a writer field's name; a reader field that so names two writer fields (its name and an alias,
  or two aliases) cannot be resolved (``ambiguous-alias``: Java's check throws). A writer field that the
  reader lacks is skipped; a reader field that the writer lacks needs a default. Paired fields are
  resolved recursively.
- enums: names as for records; a writer symbol that the reader lacks is an error unless the reader's enum
  has a ``default``.
- fixed: names as for records, and the same size. arrays: items, maps: values, resolved recursively.
- unions: a writer union is readable if each of its branches is (one branch is what one datum carries); a
  reader union reads a writer type with the *first* of its branches that matches (same kind and name, or a
  promotion), and that branch must then resolve completely.

Each problem is an :class:`Incompatibility` with a ``rule`` id: ``type-mismatch``, ``missing-default``,
``enum-symbol``, ``fixed-size``, ``name-mismatch``, ``union-branch``, ``decimal-mismatch``,
``ambiguous-alias``. Its ``path`` says where, with fields
joined by ``.``, array items as ``[]`` and map values as ``{}``: ``address.city``, ``items[].quantity``,
``attrs{}.x``; ``""`` is the top-level schema. Union branches add nothing to the path. Field names in paths
are the reader's (for a field renamed with an alias, the reader's new name). A named type used in several
places is checked at each; a recursive type is checked once per (reader, writer) pair on a path, so its
problems are reported at their shallowest path. Each schema is checked by
:func:`cdc.avro.validate.validate_schema` first: one that is not valid Avro raises
:class:`InvalidSchemaError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from cdc.avro.validate import InvalidSchemaError, validate_schema

__all__ = ["Incompatibility", "InvalidSchemaError", "Node", "parse", "reader_can_read", "resolve"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


@dataclass(frozen=True)
class Incompatibility:
    """One reason why a reader cannot read a writer's data.

    ``writer`` and ``reader`` briefly describe each side of the problem (a type, an enum symbol, a size or a
    name) so that :class:`~cdc.avro.compat.Violation` can phrase it in terms of versions; they never hold
    payload data.
    """

    path: str
    rule: str
    message: str
    writer: str = ""
    reader: str = ""


# Normalised schemas. Named types are shared objects (identity = one definition), so a recursive schema is a
# cyclic graph and the checker can tell "the same pair again" apart from "two types with equal names".
@dataclass(eq=False)
class _Named:
    kind: str  # record | enum | fixed
    fullname: str
    aliases: frozenset[str]  # full names, each resolved against the type's namespace
    fields: list[_Field] = field(default_factory=list)
    symbols: tuple[str, ...] = ()
    has_default: bool = False
    size: int = 0
    decimal: tuple[int, int] | None = None  # a fixed's (precision, scale), if it is a valid decimal

    @property
    def name(self) -> str:
        return self.fullname.rpartition(".")[2]


@dataclass(frozen=True)
class _Field:
    name: str
    aliases: tuple[str, ...]
    type: Node
    has_default: bool


@dataclass(frozen=True)
class _Array:
    items: Node


@dataclass(frozen=True)
class _Map:
    values: Node


@dataclass(frozen=True)
class _Union:
    branches: tuple[Node, ...]


@dataclass(frozen=True)
class _Decimal:  # bytes with a valid decimal logical type: bytes, but for the decimal-mismatch rule
    precision: int
    scale: int


Node: TypeAlias = str | _Array | _Map | _Union | _Named | _Decimal


def _decimal(schema: dict[str, Any]) -> tuple[int, int] | None:
    # What validate_schema left is valid; an invalid decimal lost its logicalType there.
    if schema.get("logicalType") != "decimal":
        return None
    return int(schema["precision"]), int(schema.get("scale", 0))


def _kind(node: Node) -> Node:  # a decimal's underlying type
    return "bytes" if isinstance(node, _Decimal) else node


class _Parser:
    def __init__(self) -> None:
        self.names: dict[str, _Named] = {}

    def parse(self, schema: Any, namespace: str) -> Node:
        if isinstance(schema, str):
            return schema if schema in _PRIMITIVES else self._lookup(schema, namespace)
        if isinstance(schema, list):
            return _Union(tuple(self.parse(branch, namespace) for branch in schema))
        if isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "enum", "fixed"):
                return self._named(kind, schema, namespace)
            if kind == "array":
                return _Array(self.parse(_require(schema, "items"), namespace))
            if kind == "map":
                return _Map(self.parse(_require(schema, "values"), namespace))
            if kind == "bytes" and (decimal := _decimal(schema)) is not None:
                return _Decimal(*decimal)
            # {"type": "long", "logicalType": ...} and wrapped references resolve like their "type".
            if isinstance(kind, str | list | dict):
                return self.parse(kind, namespace)
        raise InvalidSchemaError(
            "", "schema", f"not an Avro schema: a JSON {type(schema).__name__} without a valid 'type'"
        )

    def _lookup(self, ref: str, namespace: str) -> _Named:
        candidates = [ref] if "." in ref or not namespace else [f"{namespace}.{ref}", ref]
        for fullname in candidates:
            if fullname in self.names:
                return self.names[fullname]
        raise InvalidSchemaError("", "undefined-name", f"type {ref!r} is not defined before its use")

    def _named(self, kind: str, schema: dict[str, Any], namespace: str) -> _Named:
        name = _require(schema, "name")
        if not isinstance(name, str) or not name:
            raise InvalidSchemaError("", "name", f"a {kind} needs a non-empty string 'name'")
        if "." in name:
            namespace, _, name = name.rpartition(".")
        else:
            namespace = (schema["namespace"] if "namespace" in schema else namespace) or ""
        fullname = f"{namespace}.{name}" if namespace else name
        if fullname in self.names:
            raise InvalidSchemaError("", "defined-once", f"type {fullname!r} is defined twice")
        aliases = frozenset(_alias(a, namespace) for a in schema.get("aliases", ()))
        node = _Named(kind, fullname, aliases)
        # Registered before its fields are parsed, so that a field may refer to its own record.
        self.names[fullname] = node
        if kind == "record":
            for f in _require(schema, "fields"):
                field_type = self.parse(_require(f, "type"), namespace)
                field_aliases = tuple(f.get("aliases", ()))
                node.fields.append(_Field(_require(f, "name"), field_aliases, field_type, "default" in f))
        elif kind == "enum":
            node.symbols = tuple(_require(schema, "symbols"))
            node.has_default = "default" in schema
        else:
            node.size = int(_require(schema, "size"))
            node.decimal = _decimal(schema)
        return node


def _alias(alias: str, namespace: str) -> str:
    """The full name an alias stands for, as Java resolves it: relative to the type's namespace when it has no
    dot; an empty namespace before the dot (".Old") is the null namespace, which Java's check then never
    matches from a type that has a namespace (it compares ".Old" with the writer's full name)."""
    if "." not in alias:
        return f"{namespace}.{alias}" if namespace else alias
    space, _, short = alias.rpartition(".")
    return f"{space}.{short}" if space else (f".{short}" if namespace else short)


def _require(obj: Any, key: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InvalidSchemaError("", "missing-attribute", f"a schema object lacks its {key!r} attribute")
    return obj[key]


def parse(schema: Any) -> Node:
    """The resolution form of ``schema``; InvalidSchemaError when it is not valid Avro."""
    return _Parser().parse(validate_schema(schema), "")


def _describe(node: Node) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, _Array):
        return f"array<{_describe(node.items)}>"
    if isinstance(node, _Map):
        return f"map<{_describe(node.values)}>"
    if isinstance(node, _Union):
        return "[" + ", ".join(_describe(b) for b in node.branches) + "]"
    if isinstance(node, _Decimal):
        return f"decimal({node.precision}, {node.scale})"
    return f"{node.kind} {node.name}"


def _names_match(reader: _Named, writer: _Named) -> bool:
    return writer.name == reader.name or writer.fullname in reader.aliases


def _matches(reader: Node, writer: Node) -> bool:
    """The spec's notion of "match", which picks a reader union's branch before recursive resolution."""
    reader, writer = _kind(reader), _kind(writer)
    if isinstance(reader, str) and isinstance(writer, str):
        return reader == writer or reader in _PROMOTIONS.get(writer, frozenset())
    if isinstance(reader, _Array) and isinstance(writer, _Array):
        return True
    if isinstance(reader, _Map) and isinstance(writer, _Map):
        return True
    if isinstance(reader, _Named) and isinstance(writer, _Named) and reader.kind == writer.kind:
        return _names_match(reader, writer) and (reader.kind != "fixed" or reader.size == writer.size)
    return False


_DECIMALS = "decimals match only with equal precision and scale (the specification; Java ignores it)."


class _Checker:
    def __init__(self) -> None:
        self.problems: list[Incompatibility] = []
        # Record pairs under check on the current path: meeting one again means recursion, whose problems
        # are already being reported one level up.
        self.active: set[tuple[_Named, _Named]] = set()

    def add(self, path: str, rule: str, message: str, writer: str = "", reader: str = "") -> None:
        self.problems.append(Incompatibility(path, rule, message, writer, reader))

    def mismatch(self, path: str, rule: str, writer: Node, reader: Node, template: str) -> None:
        w, r = _describe(writer), _describe(reader)
        self.add(path, rule, template.format(w=w, r=r), w, r)

    def check(self, reader: Node, writer: Node, path: str) -> None:
        if isinstance(writer, _Union):
            for branch in writer.branches:
                if isinstance(reader, _Union) or _matches(reader, branch):
                    self.check(reader, branch, path)
                else:
                    template = "The writer's union branch {w} cannot be read as the reader's {r}."
                    self.mismatch(path, "union-branch", branch, reader, template)
        elif isinstance(reader, _Union):
            chosen = next((b for b in reader.branches if _matches(b, writer)), None)
            if chosen is None:
                template = "The writer's {w} matches no branch of the reader's union {r}."
                self.mismatch(path, "union-branch", writer, reader, template)
            else:
                self.check(chosen, writer, path)
        elif isinstance(reader, _Array) and isinstance(writer, _Array):
            self.check(reader.items, writer.items, f"{path}[]")
        elif isinstance(reader, _Map) and isinstance(writer, _Map):
            self.check(reader.values, writer.values, f"{path}{{}}")
        elif isinstance(reader, _Named) and isinstance(writer, _Named) and reader.kind == writer.kind:
            self.named(reader, writer, path)
        elif not _matches(reader, writer):
            template = "The writer's {w} cannot be read as the reader's {r}."
            self.mismatch(path, "type-mismatch", writer, reader, template)
        elif isinstance(reader, _Decimal) and isinstance(writer, _Decimal) and reader != writer:
            template = "The writer's {w} is not the reader's {r}: " + _DECIMALS
            self.mismatch(path, "decimal-mismatch", writer, reader, template)

    def named(self, reader: _Named, writer: _Named, path: str) -> None:
        same = _names_match(reader, writer)
        if not same:
            message = f"The writer's {writer.kind} name is neither the reader's name nor one of its aliases."
            self.add(path, "name-mismatch", message, writer.name, reader.name)
        if reader.kind == "fixed" and reader.size != writer.size:
            message = f"The writer's fixed has size {writer.size} but the reader's has size {reader.size}."
            self.add(path, "fixed-size", message, str(writer.size), str(reader.size))
        elif (
            reader.kind == "fixed"
            and None not in (reader.decimal, writer.decimal)
            and reader.decimal != writer.decimal
        ):
            w, r = (f"decimal{d}".replace(" ", "") for d in (writer.decimal, reader.decimal))
            message = f"The writer's {w} is not the reader's {r}: {_DECIMALS}"
            self.add(path, "decimal-mismatch", message, w, r)
        elif reader.kind == "enum" and same and not reader.has_default:
            for symbol in writer.symbols:
                if symbol not in reader.symbols:
                    message = (
                        f"The writer's symbol {symbol} is not in the reader's enum, which has no default."
                    )
                    self.add(path, "enum-symbol", message, symbol)
        elif reader.kind == "record" and same and (reader, writer) not in self.active:
            self.active.add((reader, writer))
            self.record(reader, writer, path)
            self.active.discard((reader, writer))

    def record(self, reader: _Named, writer: _Named, path: str) -> None:
        writer_fields = {f.name: f for f in writer.fields}
        for rf in reader.fields:
            # As Java's lookupWriterField: the name and each alias may each find a writer field.
            found = [writer_fields[n] for n in (rf.name, *rf.aliases) if n in writer_fields]
            field_path = f"{path}.{rf.name}" if path else rf.name
            if len(found) > 1:
                names = ", ".join(f.name for f in found)
                message = (
                    f"The reader's field {rf.name} names several writer fields ({names}) by name and aliases."
                )
                self.add(field_path, "ambiguous-alias", message, names, rf.name)
            elif found:
                self.check(rf.type, found[0].type, field_path)
            elif not rf.has_default:
                message = f"The reader's field {rf.name} is not in the writer's record and has no default."
                self.add(field_path, "missing-default", message)


def resolve(reader: Node, writer: Node) -> list[Incompatibility]:
    checker = _Checker()
    checker.check(reader, writer, "")
    return checker.problems


def reader_can_read(reader: Any, writer: Any) -> list[Incompatibility]:
    """Every reason why data written with ``writer`` cannot be read with ``reader``; empty if it can."""
    return resolve(parse(reader), parse(writer))
