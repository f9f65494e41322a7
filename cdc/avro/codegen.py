"""Compiles a schema into an encoder: straight-line Python that validates a JSON value and writes its Avro.

:mod:`cdc.avro.encoder` calls :func:`check_schema`, then :func:`build`, once per schema it is asked to
encode with; the function made here writes byte for byte what ``fastavro.schemaless_writer`` writes (the
tests check it). A schema file is data from a pull request, so it must never become code: fastavro's parser
lets a fixed's ``size`` be any JSON value and names be any string, hence every attribute the generator reads
is type-checked first (:func:`check_schema`: size an integer >= 0, names Avro names, symbols a list of them),
and the generated source holds only names and numbers the generator made itself; every value taken from the
schema reaches it through its namespace, beside the helpers of :mod:`cdc.avro.runtime`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from cdc.avro.runtime import DISPATCH, RUNTIME, VI, Invalid
from cdc.avro.store import AVRO_NAME

__all__ = ["BadSchema", "EncodeFn", "build", "check_schema"]

EncodeFn = Callable[[Any, bytearray], None]
_FULLNAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

_PRIMITIVE: Final = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_ACCEPTS: Final = {  # kind: the Python types of the JSON values it takes
    **dict.fromkeys(["bytes", "string", "enum", "fixed"], "str"),
    **dict.fromkeys(["map", "record", "error"], "dict"),
    **dict.fromkeys(["int", "long"], "int"),
    **dict.fromkeys(["float", "double"], "int float"),
    "null": "NoneType",
    "boolean": "bool",
    "array": "list",
}
# The code of each kind, {x} being the variable holding the value; {lab}, {size}, {sym} and {p} are names
# (or tuples of names) in the generated code's namespace, never the schema's text. "? " marks the JSON type
# check, left out where a union checked already. [VARINT] appends the varint of z (>= 0), [LATIN1] sets b
# to a string's bytes.
_TEXT: Final = r"""
[VARINT]
if z < 16384: out += _VI[z]
elif z < 268435456: out += _VC[z & 16383]; out += _VI[z >> 14]
else: out += _varint(z)
[LATIN1]
try: b = {x}.encode('latin-1')
except UnicodeEncodeError: raise _bad({p}, {lab} + ' (code points U+0000..U+00FF)', {x}) from None
[null]
? if {x} is not None: {bad})
[boolean]
if {x} is True: out += b'\x01'
elif {x} is False: out += b'\x00'
else: {bad})
[int]
if type({x}) is not int or not -2147483648 <= {x} <= 2147483647: {bad}, (int,))
z = ({x} << 1) ^ ({x} >> 31)
VARINT
[long]
if type({x}) is not int or not -9223372036854775808 <= {x} <= 9223372036854775807: {bad}, (int,))
z = ({x} << 1) ^ ({x} >> 63)
VARINT
[float]
if (type({x}) is float or type({x}) is int) and abs({x}) <= 3.4028234663852886e38: out += _pf({x})
else: {bad}, (int, float))
[double]
if type({x}) is float or type({x}) is int: out += _pd({x})
else: {bad})
[string]
? if type({x}) is not str: {bad})
b = {x}.encode()
z = len(b) << 1
VARINT
out += b
[bytes]
? if type({x}) is not str: {bad})
LATIN1
z = len(b) << 1
VARINT
out += b
[fixed]
? if type({x}) is not str: {bad})
LATIN1
if len(b) != {size}: raise _Invalid({p}, 'expects %s of %d bytes, got another length' % ({lab}, {size}))
out += b
[enum]
b = {sym}.get({x}) if type({x}) is str else None
if b is None: raise _bad({p}, 'one of the symbols of ' + {lab}, {x})
out += b
"""


def _templates(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for line in text.strip().splitlines():
        if line.startswith("["):
            current = sections[line.strip("[]")] = []
        else:
            current += sections.get(line, [line])
    return sections


_CODE: Final = _templates(_TEXT)


_Defaults = dict[int, bytes | None]  # id of a field -> its encoded default (None while it compiles)


class _Restart(Exception):  # a record turned out to be recursive: compile again, giving it a function
    pass


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


def build(schema: Any, named: dict[str, Any], defaults: _Defaults, recursive: set[str]) -> EncodeFn:
    while True:
        gen = _Gen(named, defaults, recursive)
        try:
            name = gen.function(schema)
        except _Restart:
            continue
        exec(compile("\n".join(gen.src), "<cdc.avro generated>", "exec"), gen.ns)  # source made by _Gen
        fn: EncodeFn = gen.ns[name]
        return fn


def _resolve(schema: Any, named: dict[str, Any]) -> tuple[str, Any]:
    """``(kind, schema)`` for any schema form: a name, a primitive, ``{"type": ...}`` or a union (a list)."""
    while not isinstance(schema, list):
        if isinstance(schema, str):
            schema = {"type": schema} if schema in _PRIMITIVE else named[schema]
        if isinstance(schema["type"], str) and schema["type"] in _ACCEPTS:
            return str(schema["type"]), schema
        schema = schema["type"]
    return "union", schema


def _label(kind: str, schema: Any, named: dict[str, Any]) -> str:
    if kind == "union":
        return " or ".join(_label(*_resolve(branch, named), named) for branch in schema)
    return f"{kind} {str(schema['name']).rpartition('.')[2]}" if "name" in schema else kind


def _tup(path: list[str]) -> str:
    return f"({', '.join(path)},)" if path else "()"


class _Gen:
    """Writes the source of one encoder: ``def _fN(x, out)`` appends the Avro binary of ``x`` to ``out``."""

    def __init__(self, named: dict[str, Any], defaults: _Defaults, recursive: set[str]) -> None:
        self.named, self.defaults, self.recursive = named, defaults, recursive
        self.ns: dict[str, Any] = {**RUNTIME, "_D": defaults}
        self.src, self.lines = list[str](), list[str]()
        self.funcs: dict[str, str] = {}  # recursive record -> its function
        self.active: set[str] = set()  # records being inlined
        self.count = 0
        self.consts: dict[tuple[type, object], str] = {}  # a schema's string or number -> its name in ns

    def new(self, prefix: str, value: object = None) -> str:
        self.count += 1
        if value is not None:
            self.ns[f"{prefix}{self.count}"] = value
        return f"{prefix}{self.count}"

    def const(self, value: str | int) -> str:
        """The namespace name holding ``value``: what comes from a schema is never pasted into the source."""
        key = (type(value), value)
        if (name := self.consts.get(key)) is None:
            name = self.consts[key] = self.new("_c", value)
        return name

    def w(self, ind: int, *lines: str) -> None:
        self.lines += ["    " * ind + line for line in lines]

    def function(self, schema: Any, record: str = "") -> str:  # record: a recursive record's name
        name, saved = self.new("_f"), self.lines
        self.lines = [f"def {name}(x, out):"]
        if record:
            self.funcs[record] = name
        self.emit(schema, "x", [], 1, 0)  # a recursive record is inlined at the top of its own function only
        self.src, self.lines = self.src + self.lines, saved
        return name

    def call(self, fn: str, x: str, path: list[str], ind: int) -> None:
        catch = f"except _Invalid as e: e.path = {_tup(path)} + e.path; raise"
        self.w(ind, *([f"try: {fn}({x}, out)", catch] if path else [f"{fn}({x}, out)"]))

    def emit(self, schema: Any, x: str, path: list[str], ind: int, blocks: int, union: str = "") -> None:
        """Code for the value in variable ``x``; from a union, ``union`` names it and the type is checked."""
        kind, s = _resolve(schema, self.named)
        lab, p, w, checked = union or self.const(_label(kind, s, self.named)), _tup(path), self.w, bool(union)
        if kind in ("record", "error") and s["name"] in self.recursive and path:
            return self.call(self.funcs.get(s["name"]) or self.function(s, s["name"]), x, path, ind)
        if (blocks >= 8 or ind >= 40) and kind in ("record", "error", "array", "map", "union"):
            return self.call(self.function(s), x, path, ind)  # far from Python's limits of nesting (20, 100)
        if kind == "union":
            return self.union(s, x, path, ind, blocks, lab)
        sym = self.new("_S", {v: VI[i << 1] for i, v in enumerate(s["symbols"])}) if kind == "enum" else ""
        args = {
            "x": x,
            "p": p,
            "lab": lab,
            "size": self.const(s["size"]) if kind == "fixed" else "",
            "sym": sym,
            "bad": f"raise _bad({p}, {lab}, {x}",
        }
        code = _CODE.get(kind, ["? if type({x}) is not " + _ACCEPTS[kind] + ": {bad})"])
        w(
            ind,
            *(line.removeprefix("? ").format(**args) for line in code if not (checked and line[:2] == "? ")),
        )
        if kind in ("array", "map"):
            i, y = self.new("i"), self.new("y")
            w(ind, f"if {x}:")
            w(ind + 1, f"z = len({x}) << 1", *_CODE["VARINT"])
            if kind == "array":
                w(ind + 1, f"for {i}, {y} in enumerate({x}):")
                self.emit(s["items"], y, [*path, i], ind + 2, blocks + 1)
            else:
                w(ind + 1, f"for {i}, ({y}k, {y}) in enumerate({x}.items()):")
                w(ind + 2, f"b = {y}k.encode()", "z = len(b) << 1", *_CODE["VARINT"], "out += b")
                self.emit(s["values"], y, [*path, f"'{{#%d}}' % {i}"], ind + 2, blocks + 1)
            w(ind, "out += b'\\x00'")
        elif kind in ("record", "error"):
            if s["name"] in self.active and s["name"] not in self.recursive:
                self.recursive.add(s["name"])
                raise _Restart
            self.active.add(s["name"])
            self.record(s, x, path, ind, blocks, lab)

    def record(self, s: Any, x: str, path: list[str], ind: int, blocks: int, lab: str) -> None:
        fields, w = s["fields"], self.w
        d = self.new("d") if any("default" in f for f in fields) else ""
        w(ind, *([f"{d} = 0"] if d else []))
        for f in fields:
            y, name = self.new("y"), self.const(f["name"])
            fpath = [*path, name]
            if "default" in f:
                if id(f) not in self.defaults:  # None: a placeholder while a recursive default compiles
                    self.defaults[id(f)], out = None, bytearray()
                    try:
                        build(f["type"], self.named, self.defaults, self.recursive)(f["default"], out)
                    except Invalid as exc:
                        raise ValueError(
                            f"field {f['name']!r} of {self.ns[lab]}: {exc.render('default')}"
                        ) from None
                    self.defaults[id(f)] = bytes(out)
                w(ind, f"if {name} in {x}:", f"    {y} = {x}[{name}]")
                self.emit(f["type"], y, fpath, ind + 1, blocks)
                w(ind, f"else: out += _D[{id(f)}]; {d} += 1")
            else:
                w(
                    ind,
                    f"try: {y} = {x}[{name}]",
                    f"except KeyError: raise _Invalid({_tup(fpath)}, 'is required but missing') from None",
                )
                self.emit(f["type"], y, fpath, ind, blocks)
        count = f"len({x}) + {d}" if d else f"len({x})"
        known = self.new("_K", frozenset(f["name"] for f in fields))
        w(ind, f"if {count} != {len(fields)}: raise _unknown({_tup(path)}, {x}, {known})")
        self.active.discard(s["name"])

    def union(self, branches: list[Any], x: str, path: list[str], ind: int, blocks: int, lab: str) -> None:
        """Dispatch on the JSON type; when several branches take it, try them in order, undoing failures.
        ``lab`` is the namespace name of the union's label."""
        kinds, w, kw = [_resolve(b, self.named)[0] for b in branches], self.w, "if"
        for pytype, json_type in DISPATCH.items():
            cands = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS[k].split()]
            if cands:
                w(ind, f"{kw} " + (f"{x} is None:" if pytype == "NoneType" else f"type({x}) is {pytype}:"))
                kw = "elif"
            if len(cands) == 1:
                w(ind + 1, f"out += {VI[cands[0] << 1]!r}")
                self.emit(branches[cands[0]], x, path, ind + 1, blocks, lab)
            elif cands:
                m, ok = self.new("m"), self.new("ok")
                w(ind + 1, f"{m} = len(out); {ok} = False")
                for i in cands:
                    w(ind + 1, f"if not {ok}:", "    try:", f"        out += {VI[i << 1]!r}")
                    self.emit(branches[i], x, path, ind + 3, blocks + 2, lab)
                    w(ind + 2, f"    {ok} = True", f"except _Invalid: del out[{m}:]")
                problem = self.const(
                    f"expects {self.ns[lab]}, got {json_type} that fits none of its branches"
                )
                w(ind + 1, f"if not {ok}: raise _Invalid({_tup(path)}, {problem})")
        w(ind, f"else: raise _bad({_tup(path)}, {lab}, {x})")
