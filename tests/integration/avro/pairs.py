"""A seeded generator of (old, new) schema pairs for the differential test against Apache Avro's Java library.

Each pair is a base event schema (a record named ``Event``, as ``schemas/Event/v<N>.avsc`` needs) and a
mutation of it: promotions and type changes, fields added or removed with and without defaults, renames of
fields and of named types with and without aliases across namespaces, enum symbols and enum defaults, fixed
sizes, unions grown, shrunk, reordered, nested records in arrays, maps and unions, recursive types, logical
types, names that are not Avro names, and defaults of every type, valid and not. The same seed gives the same
pairs, so a disagreement can be replayed by its id.

A pair on which the project departs from Java on purpose (a rule of docs/schema-checks.md where Java departs
from the specification) carries that rule's name in ``departure`` and the project's verdict in ``expect``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
PROMOTIONS = {"int": ["long", "float", "double"], "long": ["float", "double"], "float": ["double"]}
PROMOTIONS |= {"string": ["bytes"], "bytes": ["string"]}
NAMESPACES = ["", "acme", "acme.orders", "com.example.v1"]
BAD_NAMES = ["1abc", "a-b", "a b", "x.y", "", "$x"]


@dataclass(frozen=True)
class Pair:
    id: str
    kind: str  # the mutation that made it
    old: Any
    new: Any
    departure: str = ""  # a rule of docs/schema-checks.md on which the project departs from Java
    expect: str = ""  # with a departure: the project's verdict in every mode


class Base:
    """A random event schema; named types get unique names (R1, E2, F3...), so a name finds its definition."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.count = 0
        self.defs: dict[str, dict[str, Any]] = {}  # unqualified name -> definition

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def event(self) -> dict[str, Any]:
        rng = self.rng
        schema: dict[str, Any] = {"type": "record", "name": "Event", "fields": []}
        if ns := rng.choice(NAMESPACES):
            schema["namespace"] = ns
        for i in range(rng.randint(1, 4)):
            schema["fields"].append(self.field(f"f{i}", 0))
        if rng.random() < 0.15:
            schema["fields"].append({"name": "chain", "type": self.linked_list()})
        if rng.random() < 0.15:  # a second use of a named type, by name
            named = of_kind(schema, *_NAMED)
            if named:
                target = rng.choice(named)
                schema["fields"].append({"name": "again", "type": full_name(schema, target)})
        return schema

    def linked_list(self) -> dict[str, Any]:
        name = self.name("Node")
        node = {
            "type": "record",
            "name": name,
            "fields": [
                {"name": "value", "type": "int"},
                {"name": "next", "type": ["null", name], "default": None},
            ],
        }
        self.defs[name] = node
        return node

    def field(self, name: str, depth: int) -> dict[str, Any]:
        f: dict[str, Any] = {"name": name, "type": self.type(depth)}
        if self.rng.random() < 0.4:
            f["default"] = self.default(f["type"])
        return f

    def type(self, depth: int) -> Any:
        rng = self.rng
        r = rng.random()
        if r < 0.35 or depth >= 3:
            return rng.choice(PRIMITIVES[1:])
        if r < 0.45:
            return self.logical()
        if r < 0.53:
            return self.enum()
        if r < 0.58:
            return self.fixed()
        if r < 0.68:
            return {
                "type": "array",
                "items": self.type(depth + 1) if rng.random() < 0.6 else self.record(depth + 1),
            }
        if r < 0.76:
            return {
                "type": "map",
                "values": self.type(depth + 1) if rng.random() < 0.6 else self.record(depth + 1),
            }
        if r < 0.88:
            return self.union(depth)
        return self.record(depth + 1)

    def logical(self) -> Any:
        rng = self.rng
        choice = rng.randrange(5)
        if choice == 0:
            return {"type": "int", "logicalType": "date"}
        if choice == 1:
            return {"type": "long", "logicalType": rng.choice(["timestamp-millis", "timestamp-micros"])}
        if choice == 2:
            return {"type": "string", "logicalType": "uuid"}
        if choice == 3:
            return {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
        fixed = self.fixed(8)
        fixed |= {"logicalType": "decimal", "precision": 12, "scale": 3}
        return fixed

    def enum(self) -> dict[str, Any]:
        name = self.name("E")
        enum: dict[str, Any] = {
            "type": "enum",
            "name": name,
            "symbols": ["A", "B", "C"][: self.rng.randint(1, 3)],
        }
        if self.rng.random() < 0.3:
            enum["default"] = enum["symbols"][0]
        self.defs[name] = enum
        return enum

    def fixed(self, size: int | None = None) -> dict[str, Any]:
        name = self.name("F")
        fixed = {
            "type": "fixed",
            "name": name,
            "size": size if size is not None else self.rng.choice([1, 4, 16]),
        }
        self.defs[name] = fixed
        return fixed

    def union(self, depth: int) -> list[Any]:
        rng = self.rng
        if rng.random() < 0.5:
            return ["null", self.non_union(depth + 1)]
        picked = rng.sample(PRIMITIVES, rng.randint(2, 3))
        if rng.random() < 0.3:
            picked.append(self.record(depth + 1))
        if rng.random() < 0.2:
            picked.append({"type": "array", "items": "int"})
        rng.shuffle(picked)
        return picked

    def non_union(self, depth: int) -> Any:
        while isinstance(t := self.type(depth), list):
            pass
        return t

    def record(self, depth: int) -> dict[str, Any]:
        name = self.name("R")
        rec: dict[str, Any] = {"type": "record", "name": name, "fields": []}
        if self.rng.random() < 0.2:
            rec["namespace"] = self.rng.choice(NAMESPACES[1:])
        self.defs[name] = rec
        for i in range(self.rng.randint(1, 3)):
            rec["fields"].append(self.field(f"g{i}", depth))
        return rec

    def default(self, t: Any) -> Any:
        """A valid default for ``t`` (for a union, one of any of its branches)."""
        rng = self.rng
        if isinstance(t, list):
            return self.default(t[0] if rng.random() < 0.7 else rng.choice(t))
        if isinstance(t, str):
            if t in self.defs:
                return self.default(self.defs[t])
            if "." in t and t.rpartition(".")[2] in self.defs:
                return self.default(self.defs[t.rpartition(".")[2]])
            return {
                "null": None,
                "boolean": rng.choice([True, False]),
                "int": rng.randint(-5, 5),
                "long": 2**40,
                "float": 1.5,
                "double": -2.25,
                "bytes": "\u00e9x",
                "string": "s",
            }[t]
        kind = t["type"]
        if kind == "enum":
            return rng.choice(t["symbols"])
        if kind == "fixed":
            return "a" * t["size"]
        if kind == "array":
            return [self.default(t["items"])] if rng.random() < 0.5 else []
        if kind == "map":
            return {"k": self.default(t["values"])} if rng.random() < 0.5 else {}
        if kind == "record":
            if t["name"].startswith("Node"):
                return {"value": 0, "next": None}
            return {f["name"]: self.default(f["type"]) for f in t["fields"]}
        return self.default(kind)


def full_name(event: dict[str, Any], named: dict[str, Any]) -> str:
    """The full name of ``named`` inside ``event`` (nested types inherit the namespace of their parent)."""
    found = _namespace_of(event, named, event.get("namespace", ""))
    ns = found if found is not None else ""
    return f"{ns}.{named['name']}" if ns else named["name"]


def _namespace_of(node: Any, target: dict[str, Any], ns: str) -> str | None:
    if isinstance(node, list):
        for branch in node:
            if (hit := _namespace_of(branch, target, ns)) is not None:
                return hit
        return None
    if not isinstance(node, dict):
        return None
    if node.get("type") in ("record", "enum", "fixed"):
        ns = node.get("namespace", ns) if "." not in node["name"] else node["name"].rpartition(".")[0]
        if node is target:
            return ns
    if node.get("type") == "record":
        for f in node.get("fields", []):
            if (hit := _namespace_of(f.get("type"), target, ns)) is not None:
                return hit
    for key in ("items", "values"):
        if key in node and (hit := _namespace_of(node[key], target, ns)) is not None:
            return hit
    return None


def nodes(schema: Any) -> Iterator[Any]:
    """Every schema object and union in ``schema``, definitions only (references are strings)."""
    if isinstance(schema, list):
        yield schema
        for branch in schema:
            yield from nodes(branch)
    elif isinstance(schema, dict):
        yield schema
        if schema.get("type") == "record":
            for f in schema["fields"]:
                yield from nodes(f["type"])
        for key in ("items", "values"):
            if key in schema:
                yield from nodes(schema[key])


def records(schema: Any) -> list[dict[str, Any]]:
    return [n for n in nodes(schema) if isinstance(n, dict) and n.get("type") == "record"]


def of_kind(schema: Any, *kinds: str) -> list[dict[str, Any]]:
    return [n for n in nodes(schema) if isinstance(n, dict) and n.get("type") in kinds and n is not schema]


def fields(schema: Any) -> list[dict[str, Any]]:
    return [f for r in records(schema) for f in r["fields"]]


def unions(schema: Any) -> list[list[Any]]:
    return [n for n in nodes(schema) if isinstance(n, list)]


def rename_references(schema: Any, old_names: set[str], new: str) -> None:
    """Point every reference (a type given by name) to one of ``old_names`` at ``new``."""

    def fix(holder: Any, key: Any) -> None:
        value = holder[key]
        if isinstance(value, str) and value in old_names:
            holder[key] = new
        elif isinstance(value, list):
            for i in range(len(value)):
                fix(value, i)
        elif isinstance(value, dict):
            if value.get("type") == "record":
                for f in value["fields"]:
                    fix(f, "type")
            for k in ("items", "values"):
                if k in value:
                    fix(value, k)

    fix({"x": schema}, "x")


def null_namespace_reference(schema: Any) -> bool:
    """Whether a relative reference inside a namespace names a type of the null namespace: undefined for the
    specification, while Java falls back to the null namespace."""
    defined: set[str] = set()
    found = False

    def walk(t: Any, ns: str) -> None:
        nonlocal found
        if isinstance(t, str):
            if "." not in t and ns and f"{ns}.{t}" not in defined and t in defined:
                found = True
        elif isinstance(t, list):
            for x in t:
                walk(x, ns)
        elif isinstance(t, dict):
            if t.get("type") in _NAMED and isinstance(t.get("name"), str):
                name = t["name"]
                ns = name.rpartition(".")[0] if "." in name else t.get("namespace", ns)
                ns = ns if isinstance(ns, str) else ""
                defined.add(f"{ns}.{name.rpartition('.')[2]}" if ns else name.rpartition(".")[2])
            if t.get("type") == "record":
                for f in t.get("fields", []):
                    if isinstance(f, dict):
                        walk(f.get("type"), ns)
            for k in ("items", "values"):
                if k in t:
                    walk(t[k], ns)

    walk(schema, "")
    return found


Mutation = Callable[[Base, random.Random, dict[str, Any]], tuple[Any, Any, str, str] | None]


def m_identity(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    return old, copy.deepcopy(old), "", ""


def m_change_type(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """A primitive field becomes a promotion of its type, a demotion, or something else."""
    new = copy.deepcopy(old)
    candidates = [f for f in fields(new) if isinstance(f["type"], str) and f["type"] in PRIMITIVES]
    if not candidates:
        return None
    f = rng.choice(candidates)
    was = f["type"]
    pool = PROMOTIONS.get(was, []) * 3 + [t for t in PRIMITIVES if t != was]
    f["type"] = rng.choice(pool)
    if "default" in f:
        if rng.random() < 0.5:
            del f["default"]
        else:
            f["default"] = b.default(f["type"])
    return old, new, "", ""


def m_add_field(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    new = copy.deepcopy(old)
    rec = rng.choice(records(new))
    added: dict[str, Any] = {"name": f"added{b.name('')}", "type": b.type(2)}
    if rng.random() < 0.5:
        added["default"] = b.default(added["type"])
    rec["fields"].insert(rng.randint(0, len(rec["fields"])), added)
    return old, new, "", ""


def m_remove_field(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    new = copy.deepcopy(old)
    candidates = [r for r in records(new) if len(r["fields"]) > 1 and not r["name"].startswith("Node")]
    if not candidates:
        return None
    rec = rng.choice(candidates)
    removed = rec["fields"].pop(rng.randrange(len(rec["fields"])))
    if any(
        isinstance(n, dict) and n.get("type") in ("record", "enum", "fixed") for n in nodes(removed["type"])
    ):
        return None  # it defined a type that something else may use by name
    return old, new, "", ""


def m_rename_field(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    new = copy.deepcopy(old)
    rec = rng.choice([r for r in records(new) if not r["name"].startswith("Node")])
    f = rng.choice(rec["fields"])
    was = f["name"]
    f["name"] = f"{was}_renamed"
    how = rng.randrange(5)
    if how == 1:
        f["aliases"] = [was]
    elif how == 2:
        f["aliases"] = ["unrelated", was]
    elif how == 3 and len(rec["fields"]) > 1:  # an alias that names another field of the writer too
        other = rng.choice([g for g in rec["fields"] if g is not f])
        f["aliases"] = [was, other["name"]]
    elif how == 4:
        f["aliases"] = [f"ns.{was}"]  # a field alias is a plain name: a dotted one matches nothing
    if rng.random() < 0.5:  # and sometimes the other way round: the old schema knows the new name
        old, new = new, old
    return old, new, "", ""


def m_rename_type(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """Rename or move a named type: no alias, a relative alias, a full alias, or one of another namespace."""
    new = copy.deepcopy(old)
    named = [n for n in of_kind(new, "record", "enum", "fixed") if not n["name"].startswith("Node")]
    if not named:
        return None
    t = rng.choice(named)
    was_full = full_name(new, t)
    was_ns, _, was = was_full.rpartition(".")
    olds = {was, was_full}
    move = rng.randrange(4)  # 0: rename in place, 1: move, 2: rename and move, 3: rename with a dotted name
    name = f"{was}X" if move in (0, 2, 3) else was
    target_ns = rng.choice([ns for ns in NAMESPACES if ns != was_ns]) if move in (1, 2, 3) else was_ns
    if move == 3 and target_ns:
        t["name"] = f"{target_ns}.{name}"
        t.pop("namespace", None)
    else:
        t["name"] = name
        if move in (1, 2):
            t["namespace"] = target_ns
    alias_kind = rng.randrange(5)
    if alias_kind == 1:
        t["aliases"] = [was]  # relative: resolved in the new namespace
    elif alias_kind == 2:
        t["aliases"] = [was_full]  # fully qualified
    elif alias_kind == 3:
        other = rng.choice([ns for ns in NAMESPACES[1:] if ns != was_ns])
        t["aliases"] = [f"{other}.{was}"]  # qualified with the wrong namespace
    elif alias_kind == 4:
        t["aliases"] = [f".{was}"] if not was_ns else ["Unrelated", was]
    rename_references(new, olds, full_name(new, t))
    if rng.random() < 0.4:
        old, new = new, old
    return old, new, "", ""


def m_move_top(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """Move the event record to another namespace: nested types without one of their own move with it."""
    new = copy.deepcopy(old)
    was_ns = new.get("namespace", "")
    # References by full name must follow their types; relative ones already do.
    targets = {full_name(new, n): n for n in of_kind(new, "record", "enum", "fixed")}
    ns = rng.choice([n for n in NAMESPACES if n != was_ns])
    new["namespace"] = ns
    for was_full, t in targets.items():
        now = full_name(new, t)
        if now != was_full:
            rename_references(new, {was_full}, now)
            if rng.random() < 0.5:
                t["aliases"] = [was_full] if rng.random() < 0.5 else [t["name"]]
    return old, new, "", ""


def m_enum(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    new = copy.deepcopy(old)
    enums = of_kind(new, "enum")
    if not enums:
        return None
    e = rng.choice(enums)
    action = rng.randrange(4)
    if action == 0:
        e["symbols"] = [*e["symbols"], "NEW"]
    elif action == 1 and len(e["symbols"]) > 1:
        e["symbols"] = e["symbols"][:-1]
    elif action == 2:
        e["symbols"] = list(reversed(e["symbols"]))
    else:
        e["symbols"] = [*e["symbols"], "NEW"]
        e["default"] = e["symbols"][0]
    if rng.random() < 0.3:
        if "default" in e:
            del e["default"]
        else:
            e["default"] = e["symbols"][-1]
    if e.get("default") not in e["symbols"]:
        e.pop("default", None)
    _repair_defaults(b, new)
    if rng.random() < 0.5:
        old, new = new, old
    return old, new, "", ""


def m_fixed(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    new = copy.deepcopy(old)
    fixed = [f for f in of_kind(new, "fixed") if "logicalType" not in f]
    if not fixed:
        return None
    f = rng.choice(fixed)
    f["size"] = rng.choice([s for s in (1, 2, 4, 16) if s != f["size"]])
    _repair_defaults(b, new)
    return old, new, "", ""


def m_union(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """Grow, shrink or reorder a union; make a type a union, or a union one of its branches."""
    new = copy.deepcopy(old)
    action = rng.randrange(5)
    if action == 3:
        f = rng.choice(fields(new))
        if isinstance(f["type"], list) or _defines(f["type"]):
            return None
        f["type"] = ["null", f["type"]] if rng.random() < 0.6 else [f["type"], "null"]
    elif action == 4:
        candidates = [f for f in fields(new) if isinstance(f["type"], list) and len(f["type"]) > 1]
        if not candidates:
            return None
        f = rng.choice(candidates)
        keep = rng.choice(f["type"])
        if any(_defines(x) for x in f["type"] if x is not keep):
            return None
        f["type"] = keep
    else:
        candidates = [
            u for u in unions(new) if not any(isinstance(x, str) and x.startswith("Node") for x in u)
        ]
        if not candidates:
            return None
        u = rng.choice(candidates)
        if action == 0:
            present = {x if isinstance(x, str) else x.get("type") for x in u}
            extra = [t for t in PRIMITIVES if t not in present]
            if not extra:
                return None
            u.insert(rng.randint(0, len(u)), rng.choice(extra))
        elif action == 1:
            if len(u) < 2:
                return None
            i = rng.randrange(len(u))
            if _defines(u[i]):
                return None
            del u[i]
        else:
            rng.shuffle(u)
    _repair_defaults(b, new)
    if rng.random() < 0.5:
        old, new = new, old
    return old, new, "", ""


def m_logical(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """Change a logical type: to another one, to its underlying type, or to an invalid one (then ignored)."""
    new = copy.deepcopy(old)
    candidates = [i for i, f in enumerate(fields(new)) if not _defines(f["type"])]
    if not candidates:
        return None
    index = rng.choice(candidates)
    f = fields(new)[index]
    action = rng.randrange(7)
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    if action == 0:  # precision or scale changed: the spec says they no longer match, Java ignores it
        old_f = fields(old)[index]
        old_f["type"] = dict(decimal)
        old_f.pop("default", None)
        f.pop("default", None)
        f["type"] = decimal | rng.choice([{"scale": 3}, {"precision": 12}, {"precision": 12, "scale": 4}])
        _repair_defaults(b, old)
        _repair_defaults(b, new)
        return old, new, "decimal-resolution", "incompatible"
    if action == 1:  # an invalid decimal is bytes (the spec, and Java)
        f["type"] = decimal | rng.choice([{"scale": 12}, {"precision": 0}, {"scale": -1}, {"precision": "x"}])
    elif action == 2:
        f["type"] = {"type": "long", "logicalType": rng.choice(["timestamp-millis", "timestamp-micros"])}
    elif action == 3:
        f["type"] = {"type": "int", "logicalType": rng.choice(["date", "time-millis"])}
    elif action == 4:
        f["type"] = {"type": "string", "logicalType": "uuid"}
    elif action == 5:  # a logical type on the wrong underlying type, or an unknown one: ignored
        f["type"] = rng.choice(
            [
                {"type": "string", "logicalType": "timestamp-millis"},
                {"type": "int", "logicalType": "no-such-type"},
                {"type": "fixed", "name": b.name("F"), "size": 2, "logicalType": "decimal", "precision": 20},
            ]
        )
    else:
        f["type"] = rng.choice(["bytes", "long", "int", "string"])
    _repair_defaults(b, new)
    if rng.random() < 0.5:
        old, new = new, old
    return old, new, "", ""


def _refs(schema: Any) -> list[str]:
    out: list[str] = []

    def walk(t: Any) -> None:
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, list):
            for x in t:
                walk(x)
        elif isinstance(t, dict):
            if t.get("type") == "record":
                for f in t["fields"]:
                    walk(f["type"])
            for k in ("items", "values"):
                if k in t:
                    walk(t[k])

    walk(schema)
    return out


def _names_in(t: Any) -> set[str]:
    return {n["name"].rpartition(".")[2] for n in nodes(t) if isinstance(n, dict) and n.get("type") in _NAMED}


_NAMED = ("record", "enum", "fixed")


def _defines(t: Any) -> bool:
    return any(isinstance(n, dict) and n.get("type") in _NAMED for n in nodes(t))


def _repair_defaults(b: Base, schema: dict[str, Any]) -> None:
    """After a type changed, give the defaults that no longer fit a value that does."""
    for f in fields(schema):
        if "default" in f and not _fits(b, schema, f["type"], f["default"]):
            f["default"] = b.default(f["type"])


def _fits(b: Base, schema: Any, t: Any, v: Any) -> bool:
    if isinstance(t, list):
        return any(_fits(b, schema, x, v) for x in t)
    if isinstance(t, str):
        defs = {
            n["name"].rpartition(".")[2]: n
            for n in nodes(schema)
            if isinstance(n, dict) and n.get("type") in _NAMED
        }
        if t.rpartition(".")[2] in defs:
            return _fits(b, schema, defs[t.rpartition(".")[2]], v)
        t = {"type": t}
    kind = t["type"]
    checks: dict[str, Callable[[], bool]] = {
        "null": lambda: v is None,
        "boolean": lambda: isinstance(v, bool),
        "int": lambda: type(v) is int and -(2**31) <= v < 2**31,
        "long": lambda: type(v) is int and -(2**63) <= v < 2**63,
        "float": lambda: type(v) in (int, float),
        "double": lambda: type(v) in (int, float),
        "bytes": lambda: isinstance(v, str) and all(ord(c) < 256 for c in v),
        "string": lambda: isinstance(v, str),
        "enum": lambda: v in t.get("symbols", ()),
        "fixed": lambda: isinstance(v, str) and len(v) == t.get("size"),
        "array": lambda: isinstance(v, list) and all(_fits(b, schema, t["items"], x) for x in v),
        "map": lambda: isinstance(v, dict) and all(_fits(b, schema, t["values"], x) for x in v.values()),
        "record": lambda: (
            isinstance(v, dict)
            and set(v) <= {f["name"] for f in t["fields"]}
            and all(
                _fits(b, schema, f["type"], v[f["name"]]) if f["name"] in v else "default" in f
                for f in t["fields"]
            )
        ),
    }
    if isinstance(kind, str) and kind in checks:
        return checks[kind]()
    return _fits(b, schema, kind, v)


# -- invalid schemas ---------------------------------------------------------------------------------------


def m_bad_name(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """A name that is not an Avro name: of a field, a type, a namespace, an enum symbol or a type alias."""
    new = copy.deepcopy(old)
    bad = rng.choice(BAD_NAMES)
    where = rng.randrange(7)
    departure, expect = "", ""
    if where == 0:
        rng.choice(fields(new))["name"] = bad
    elif where == 1:
        named = of_kind(new, *_NAMED)
        if not named or bad in ("x.y",):
            return None
        t = rng.choice(named)
        was = full_name(new, t)
        t["name"] = bad if bad else "Bad-Name"
        rename_references(new, {was, was.rpartition(".")[2]}, t["name"])
    elif where == 2:
        new["namespace"] = rng.choice(["a-b.c", "1a", "a..b", "ok.9x"])
    elif where == 3:
        enums = of_kind(new, "enum")
        if not enums:
            return None
        e = rng.choice(enums)
        e["symbols"] = [*e["symbols"], rng.choice(["1X", "a-b", "", "x.y"])]
    elif where == 4:  # a type alias must be a name for Java (the spec would take any string)
        named = of_kind(new, *_NAMED)
        if not named:
            return None
        rng.choice(named)["aliases"] = [rng.choice(["a-b", "1R", "x.1y"])]
    elif where == 5:  # a field alias may be any string, for both
        rng.choice(fields(new))["aliases"] = [bad or "a-b"]
    else:  # letters beyond ASCII: Java takes any Unicode letter, the spec only [A-Za-z_]
        rng.choice(fields(new))["name"] = rng.choice(["café", "größe", "名前"])
        departure, expect = "non-ascii-name", "invalid"
    if rng.random() < 0.4:
        old, new = new, old
    return old, new, departure, expect


def m_duplicate(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """Two fields of one name, two equal enum symbols, or a union with two branches of one type."""
    new = copy.deepcopy(old)
    what = rng.randrange(6)
    if what == 0:
        rec = rng.choice(records(new))
        rec["fields"].append({"name": rec["fields"][0]["name"], "type": rng.choice(["int", "string"])})
    elif what == 1:
        enums = of_kind(new, "enum")
        if not enums:
            return None
        e = rng.choice(enums)
        e["symbols"] = [*e["symbols"], e["symbols"][0]]
    else:
        dup = [
            ["int", "int"],
            ["null", {"type": "array", "items": "int"}, {"type": "array", "items": "string"}],
            [{"type": "map", "values": "int"}, "null", {"type": "map", "values": "long"}],
            ["null", "string", {"type": "string", "logicalType": "uuid"}],
            ["null", ["int", "string"]],
        ][what - 2 if what < 5 else rng.randrange(5)]
        new["fields"].append({"name": "dup", "type": dup})
    if rng.random() < 0.4:
        old, new = new, old
    return old, new, "", ""


def m_bad_attribute(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """A fixed size that is not an integer, a record without fields, an enum default that is not a symbol,
    a type that is not defined, or defined after its use (Java takes a later definition)."""
    new = copy.deepcopy(old)
    what = rng.randrange(6)
    departure, expect = "", ""
    if what == 0:
        fixed = {"type": "fixed", "name": b.name("F"), "size": rng.choice(["16", -1, 1.5, None, 2**31])}
        if fixed["size"] is None:
            del fixed["size"]
        new["fields"].append({"name": "fx", "type": fixed})
    elif what == 1:
        new["fields"].append({"name": "r", "type": {"type": "record", "name": b.name("R")}})
    elif what == 2:
        e = {"type": "enum", "name": b.name("E"), "symbols": ["A", "B"], "default": rng.choice(["Z", "a"])}
        new["fields"].append({"name": "e", "type": e})
    elif what == 3:
        new["fields"].append({"name": "u", "type": rng.choice(["NoSuchType", "acme.Nope", "record"])})
    elif what == 4:  # the name is used before the type is defined
        name = b.name("F")
        new["fields"].insert(0, {"name": "early", "type": name})
        new["fields"].append({"name": "late", "type": {"type": "fixed", "name": name, "size": 2}})
        departure, expect = "defined-before-use", "invalid"
    else:  # the same type defined twice, identically
        fixed = {"type": "fixed", "name": b.name("F"), "size": 2}
        new["fields"] += [{"name": "one", "type": fixed}, {"name": "two", "type": dict(fixed)}]
        departure, expect = "defined-once", "invalid"
    if rng.random() < 0.4:
        old, new = new, old
    return old, new, departure, expect


def m_default(b: Base, rng: random.Random, old: dict[str, Any]) -> tuple[Any, Any, str, str] | None:
    """A field with a default of one of every type, fitting or not."""
    new = copy.deepcopy(old)
    enum = {"type": "enum", "name": b.name("E"), "symbols": ["A", "B"]}
    fixed = {"type": "fixed", "name": b.name("F"), "size": 2}
    inner = {"type": "record", "name": b.name("R"), "fields": [{"name": "x", "type": "int"}]}
    cases: list[tuple[Any, Any, str]] = [  # type, default, the departure it is ("" if none)
        ("null", None, ""),
        ("null", 0, ""),
        ("boolean", True, ""),
        ("boolean", 1, ""),
        ("int", 7, ""),
        ("int", 2**31, ""),
        ("int", 1.5, ""),
        ("int", "7", ""),
        ("long", 2**40, ""),
        ("long", 1.0, ""),
        ("float", 1.5, ""),
        ("float", 2, ""),
        ("double", -0.5, ""),
        ("double", "x", ""),
        ("float", "NaN", "float-string-default"),
        ("double", rng.choice(["Infinity", "1.5"]), "float-string-default"),
        ("bytes", "\u00ff\u0000", ""),
        ("bytes", 5, ""),
        ("bytes", "\u0100", "bytes-default-code-point"),
        ("string", "", ""),
        ("string", None, ""),
        (enum, "A", ""),
        (enum, 1, ""),
        (enum, "Z", "enum-field-default"),
        (fixed, "ab", ""),
        (fixed, 2, ""),
        (fixed, "abc", "fixed-default-length"),
        ({"type": "array", "items": "int"}, [1, 2], ""),
        ({"type": "array", "items": "int"}, [1, "x"], ""),
        ({"type": "array", "items": "int"}, {}, ""),
        ({"type": "map", "values": "string"}, {"a": "b"}, ""),
        ({"type": "map", "values": "string"}, [], ""),
        (inner, {"x": 1}, ""),
        (inner, {}, ""),
        (inner, {"x": "y"}, ""),
        (["null", "int"], None, ""),
        (["null", "int"], 5, ""),  # the second branch: the spec since AVRO-3649, and Java
        (["int", "null"], None, ""),
        (["null", "int"], "x", ""),
        (["string", {"type": "array", "items": "int"}], [1], ""),
        ({"type": "int", "logicalType": "date"}, 19000, ""),
        ({"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}, "\u0001", ""),
    ]
    t, value, departure = rng.choice(cases)
    new["fields"].append({"name": "withdefault", "type": copy.deepcopy(t), "default": value})
    if rng.random() < 0.4:
        old, new = new, old
    return old, new, departure, "invalid" if departure else ""


MUTATIONS: dict[str, tuple[Mutation, int]] = {  # name: (mutation, weight)
    "identity": (m_identity, 1),
    "change-type": (m_change_type, 4),
    "add-field": (m_add_field, 3),
    "remove-field": (m_remove_field, 3),
    "rename-field": (m_rename_field, 3),
    "rename-type": (m_rename_type, 5),
    "move-namespace": (m_move_top, 2),
    "enum": (m_enum, 3),
    "fixed": (m_fixed, 2),
    "union": (m_union, 4),
    "logical": (m_logical, 3),
    "bad-name": (m_bad_name, 3),
    "duplicate": (m_duplicate, 2),
    "bad-attribute": (m_bad_attribute, 2),
    "default": (m_default, 4),
}


def generate(count: int, seed: int = 18) -> list[Pair]:
    """``count`` pairs; the mutations take turns by weight, each on a fresh random base schema."""
    schedule = [name for name, (_, weight) in MUTATIONS.items() for _ in range(weight)]
    out: list[Pair] = []
    attempt = 0
    while len(out) < count:
        kind = schedule[len(out) % len(schedule)]
        rng = random.Random(f"{seed}:{len(out)}:{attempt}")
        base = Base(rng)
        made = MUTATIONS[kind][0](base, rng, base.event())
        attempt += 1
        if made is None:
            continue
        old, new, departure, expect = made
        if not departure and (null_namespace_reference(old) or null_namespace_reference(new)):
            departure, expect = "null-namespace-reference", "invalid"
        out.append(Pair(f"{kind}-{len(out)}", kind, old, new, departure, expect))
        attempt = 0
    return out
