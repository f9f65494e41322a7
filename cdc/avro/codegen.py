"""Compiles a schema into an encoder: straight-line Python that validates a JSON value and writes its Avro.

:mod:`cdc.avro.encoder` calls :func:`cdc.avro.kinds.check_schema`, then :func:`build`, once per schema it is
asked to encode with; the function made here writes byte for byte what ``fastavro.schemaless_writer`` writes
(the tests check it; a negative decimal of -2**7, -2**15... is a byte shorter, as Java's BigInteger writes
it). A schema file is data from a pull request, so it must never become code: fastavro's parser lets a
fixed's ``size`` be any JSON value and names be any string, hence every attribute the generator reads is
type-checked first (:func:`~cdc.avro.kinds.check_schema`: size an integer >= 0, names Avro names, symbols a
list of them, a decimal's precision and scale), and the generated source holds only names and numbers the
generator made itself; every value taken from the schema (the readers of :mod:`cdc.avro.logical` included)
reaches it through its namespace, beside the helpers of :mod:`cdc.avro.runtime`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cdc.avro.kinds import LOGICAL, resolve
from cdc.avro.logical import ENCODING, TIME_KINDS, DecimalForm, decode_bytes, uuid_fixed, uuid_string
from cdc.avro.runtime import DISPATCH, RUNTIME, VI, Invalid

__all__ = ["EncodeFn", "build"]

EncodeFn = Callable[[Any, bytearray], None]

_ACCEPTS: Final = {  # kind: the Python types of the JSON values it takes
    **dict.fromkeys(["bytes", "string", "enum", "fixed", "uuid", "uuid-fixed"], "str"),
    **dict.fromkeys(["map", "record", "error"], "dict"),
    **dict.fromkeys(["int", "long"], "int"),
    **dict.fromkeys(["float", "double"], "int float Decimal"),
    **dict.fromkeys(TIME_KINDS, "int str"),
    "decimal": "str int Decimal",
    "null": "NoneType",
    "boolean": "bool",
    "array": "list",
}
_PYTYPE: Final = {"Decimal": "_Dec"}  # the generated code's names of DISPATCH's types that are not builtins
# The code of each kind, {x} being the variable holding the value; {lab}, {size}, {sym}, {conv}, {num} and {p}
# are names (or tuples of names) in the generated code's namespace, never the schema's text. "? " marks the
# JSON type check, left out where a union checked already. Upper-case sections are parts of others: [VARINT]
# appends the varint of z (>= 0), [LATIN1] sets b to a string's bytes, [ENCODED] and [DECIMAL] to what the
# readers of cdc.avro.logical make of the value, [BYTES] and [FIXED] write b. A logical kind without a section
# of its own ([time]: date, time-*, *timestamp-*) reads a string into {v}, then the code of its Avro type
# follows on {v}.
_TEXT: Final = r"""
[VARINT]
if z < 16384: out += _VI[z]
elif z < 268435456: out += _VC[z & 16383]; out += _VI[z >> 14]
else: out += _varint(z)
[LATIN1]
try: b = {x}.encode('latin-1')
except UnicodeEncodeError: raise _bad({p}, {lab} + ' (code points U+0000..U+00FF)', {x}) from None
[ENCODED]
? if type({x}) is not str: {bad})
b = {conv}({p}, {lab}, {x})
[DECIMAL]
if type({x}) is str: b = {conv}({p}, {lab}, {x})
elif type({x}) is int or type({x}) is _Dec: b = {num}({p}, {lab}, {x})
? else: {bad})
[BYTES]
z = len(b) << 1
VARINT
out += b
[FIXED]
if len(b) != {size}: raise _Invalid({p}, 'expects %s of %d bytes, got another length' % ({lab}, {size}))
out += b
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
elif type({x}) is _Dec and abs(f := float({x})) <= 3.4028234663852886e38: out += _pf(f)
else: {bad}, (int, float, _Dec))
[double]
if type({x}) is float or type({x}) is int: out += _pd({x})
elif type({x}) is _Dec and abs(f := float({x})) < _inf: out += _pd(f)
else: {bad}, (_Dec,))
[string]
? if type({x}) is not str: {bad})
b = {x}.encode()
BYTES
[bytes]
? if type({x}) is not str: {bad})
LATIN1
BYTES
[fixed]
? if type({x}) is not str: {bad})
LATIN1
FIXED
[bytes-encoded]
ENCODED
BYTES
[fixed-encoded]
ENCODED
FIXED
[uuid-fixed]
ENCODED
out += b
[uuid]
? if type({x}) is not str: {bad})
{conv}({p}, {lab}, {x})
b = {x}.encode()
BYTES
[decimal-bytes]
DECIMAL
BYTES
[decimal-fixed]
DECIMAL
out += b
[time]
if type({x}) is str: {v} = {conv}({p}, {lab}, {x})
else: {v} = {x}
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


def build(
    schema: Any, named: dict[str, Any], defaults: _Defaults, recursive: set[str], *, strict: bool = False
) -> tuple[EncodeFn, bool]:
    """The encoder of ``schema`` and whether its payloads must be parsed exactly (it has a decimal: its JSON
    numbers are then ``Decimal``, never floats). ``strict`` reads Avro's JSON encoding only, as defaults are
    written: no logical type forms, bytes as latin-1."""
    while True:
        gen = _Gen(named, defaults, recursive, strict)
        try:
            name = gen.function(schema)
        except _Restart:
            continue
        exec(compile("\n".join(gen.src), "<cdc.avro generated>", "exec"), gen.ns)  # source made by _Gen
        fn: EncodeFn = gen.ns[name]
        return fn, gen.exact


def _tup(path: list[str]) -> str:
    return f"({', '.join(path)},)" if path else "()"


class _Gen:
    """Writes the source of one encoder: ``def _fN(x, out)`` appends the Avro binary of ``x`` to ``out``."""

    def __init__(self, named: dict[str, Any], defaults: _Defaults, recursive: set[str], strict: bool) -> None:
        self.named, self.defaults, self.recursive, self.strict = named, defaults, recursive, strict
        self.ns: dict[str, Any] = {**RUNTIME, "_D": defaults}
        self.src, self.lines = list[str](), list[str]()
        self.funcs: dict[str, str] = {}  # recursive record -> its function
        self.active: set[str] = set()  # records being inlined
        self.count = 0
        self.consts: dict[tuple[type, object], str] = {}  # a schema's string or number -> its name in ns
        self.exact = False  # a decimal was written: payloads are parsed with Decimal numbers

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

    def encoding(self, s: Any, inherited: str | None) -> str | None:
        """The ``cdc.encoding`` of a bytes or fixed: its own, or its field's (None: the default, latin-1)."""
        own = s.get(ENCODING) if isinstance(s, dict) else None
        return None if self.strict else own or inherited

    def label(self, kind: str, schema: Any, enc: str | None) -> str:
        if kind == "union":
            return " or ".join(
                self.label(*resolve(b, self.named, self.strict), self.encoding_of(b, enc)) for b in schema
            )
        if kind == "decimal":
            return f"decimal({schema['precision']},{schema.get('scale', 0)})"
        if kind in LOGICAL.values():
            return "uuid" if kind == "uuid-fixed" else kind
        text = f"{kind} {str(schema['name']).rpartition('.')[2]}" if "name" in schema else kind
        return text + (f" ({enc})" if enc not in (None, "latin1") and kind in ("bytes", "fixed") else "")

    def encoding_of(self, branch: Any, enc: str | None) -> str | None:
        return self.encoding(resolve(branch, self.named, self.strict)[1], enc)

    def function(self, schema: Any, record: str = "", enc: str | None = None) -> str:
        """``record``: a recursive record's name; ``enc``: the field's cdc.encoding, for what it holds."""
        name, saved = self.new("_f"), self.lines
        self.lines = [f"def {name}(x, out):"]
        if record:
            self.funcs[record] = name
        self.emit(schema, "x", [], 1, 0, enc=enc)  # a recursive record is inlined at the top of its own only
        self.src, self.lines = self.src + self.lines, saved
        return name

    def call(self, fn: str, x: str, path: list[str], ind: int) -> None:
        catch = f"except _Invalid as e: e.path = {_tup(path)} + e.path; raise"
        self.w(ind, *([f"try: {fn}({x}, out)", catch] if path else [f"{fn}({x}, out)"]))

    def emit(
        self,
        schema: Any,
        x: str,
        path: list[str],
        ind: int,
        blocks: int,
        union: str = "",
        enc: str | None = None,
    ) -> None:
        """Code for the value in variable ``x``; from a union, ``union`` names it and the type is checked.
        ``enc`` is the cdc.encoding of the field it belongs to, for the bytes and fixed inside."""
        kind, s = resolve(schema, self.named, self.strict)
        enc = self.encoding(s, enc)
        lab, p, w, checked = union or self.const(self.label(kind, s, enc)), _tup(path), self.w, bool(union)
        if kind in ("record", "error") and s["name"] in self.recursive and path:
            return self.call(self.funcs.get(s["name"]) or self.function(s, s["name"]), x, path, ind)
        if (blocks >= 8 or ind >= 40) and kind in ("record", "error", "array", "map", "union"):
            return self.call(self.function(s, enc=enc), x, path, ind)  # far from Python's nesting limits
        if kind == "union":
            return self.union(s, x, path, ind, blocks, lab, enc)
        sym = self.new("_S", {v: VI[i << 1] for i, v in enumerate(s["symbols"])}) if kind == "enum" else ""
        args = {
            "x": x,
            "p": p,
            "lab": lab,
            "size": self.const(s["size"]) if kind in ("fixed", "uuid-fixed") else "",
            "sym": sym,
            "bad": f"raise _bad({p}, {lab}, {x}",
            **self.readers(kind, s, enc),
        }
        section = kind
        if kind in ("bytes", "fixed") and enc not in (None, "latin1"):
            section = f"{kind}-encoded"
        elif kind == "decimal":
            section = f"decimal-{s['type']}"
        elif kind in TIME_KINDS:
            section = "time"
        code = _CODE.get(section, ["? if type({x}) is not " + _ACCEPTS[kind] + ": {bad})"])
        w(
            ind,
            *(line.removeprefix("? ").format(**args) for line in code if not (checked and line[:2] == "? ")),
        )
        if kind in TIME_KINDS:  # the string was read into {v}: now the int or long it is
            self.emit(TIME_KINDS[kind][0], args["v"], path, ind, blocks, lab)
        elif kind in ("array", "map"):
            i, y = self.new("i"), self.new("y")
            w(ind, f"if {x}:")
            w(ind + 1, f"z = len({x}) << 1", *_CODE["VARINT"])
            if kind == "array":
                w(ind + 1, f"for {i}, {y} in enumerate({x}):")
                self.emit(s["items"], y, [*path, i], ind + 2, blocks + 1, enc=enc)
            else:
                w(ind + 1, f"for {i}, ({y}k, {y}) in enumerate({x}.items()):")
                w(ind + 2, f"b = {y}k.encode()", "z = len(b) << 1", *_CODE["VARINT"], "out += b")
                self.emit(s["values"], y, [*path, f"'{{#%d}}' % {i}"], ind + 2, blocks + 1, enc=enc)
            w(ind, "out += b'\\x00'")
        elif kind in ("record", "error"):
            if s["name"] in self.active and s["name"] not in self.recursive:
                self.recursive.add(s["name"])
                raise _Restart
            self.active.add(s["name"])
            self.record(s, x, path, ind, blocks, lab)

    def readers(self, kind: str, s: Any, enc: str | None) -> dict[str, str]:
        """The names of the cdc.avro.logical readers that the code of ``kind`` calls, put in the namespace."""
        if kind in ("bytes", "fixed") and enc not in (None, "latin1"):
            return {"conv": self.new("_r", decode_bytes(str(enc)))}
        if kind == "decimal":
            self.exact = True
            size = s["size"] if s["type"] == "fixed" else None
            form = DecimalForm(s["precision"], s.get("scale", 0), size, enc)
            return {"conv": self.new("_r", form.string), "num": self.new("_r", form.number)}
        if kind == "uuid":
            return {"conv": self.new("_r", uuid_string)}
        if kind == "uuid-fixed":
            return {"conv": self.new("_r", uuid_fixed(enc or "latin1"))}
        if kind in TIME_KINDS:
            return {"conv": self.new("_r", TIME_KINDS[kind][1]), "v": self.new("v")}
        return {}

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
                        # A default is Avro's JSON encoding (Apache Avro's Java code reads it so): strict.
                        fn, _ = build(f["type"], self.named, self.defaults, self.recursive, strict=True)
                        fn(f["default"], out)
                    except Invalid as exc:
                        raise ValueError(
                            f"field {f['name']!r} of {self.ns[lab]}: {exc.render('default')}"
                        ) from None
                    self.defaults[id(f)] = bytes(out)
                w(ind, f"if {name} in {x}:", f"    {y} = {x}[{name}]")
                self.emit(f["type"], y, fpath, ind + 1, blocks, enc=f.get(ENCODING))
                w(ind, f"else: out += _D[{id(f)}]; {d} += 1")
            else:
                w(
                    ind,
                    f"try: {y} = {x}[{name}]",
                    f"except KeyError: raise _Invalid({_tup(fpath)}, 'is required but missing') from None",
                )
                self.emit(f["type"], y, fpath, ind, blocks, enc=f.get(ENCODING))
        count = f"len({x}) + {d}" if d else f"len({x})"
        known = self.new("_K", frozenset(f["name"] for f in fields))
        w(ind, f"if {count} != {len(fields)}: raise _unknown({_tup(path)}, {x}, {known})")
        self.active.discard(s["name"])

    def union(
        self, branches: list[Any], x: str, path: list[str], ind: int, blocks: int, lab: str, enc: str | None
    ) -> None:
        """Dispatch on the JSON type; when several branches take it, try them in order, undoing failures.
        ``lab`` is the namespace name of the union's label."""
        kinds, w, kw = [resolve(b, self.named, self.strict)[0] for b in branches], self.w, "if"
        for pytype, json_type in DISPATCH.items():
            cands = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS[k].split()]
            if cands:
                test = (
                    f"{x} is None" if pytype == "NoneType" else f"type({x}) is {_PYTYPE.get(pytype, pytype)}"
                )
                w(ind, f"{kw} {test}:")
                kw = "elif"
            if len(cands) == 1:
                w(ind + 1, f"out += {VI[cands[0] << 1]!r}")
                self.emit(branches[cands[0]], x, path, ind + 1, blocks, lab, enc)
            elif cands:
                m, ok = self.new("m"), self.new("ok")
                w(ind + 1, f"{m} = len(out); {ok} = False")
                for i in cands:
                    w(ind + 1, f"if not {ok}:", "    try:", f"        out += {VI[i << 1]!r}")
                    self.emit(branches[i], x, path, ind + 3, blocks + 2, lab, enc)
                    w(ind + 2, f"    {ok} = True", f"except _Invalid: del out[{m}:]")
                problem = self.const(
                    f"expects {self.ns[lab]}, got {json_type} that fits none of its branches"
                )
                w(ind + 1, f"if not {ok}: raise _Invalid({_tup(path)}, {problem})")
        w(ind, f"else: raise _bad({_tup(path)}, {lab}, {x})")
