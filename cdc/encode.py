"""Encode stage: an outbox payload (JSON) becomes Avro, framed as single-object encoding.

Schemas live in ``<schemas_dir>/<event_type>/v<N>.avsc`` (``schemas/README.md``). :class:`SchemaStore`
loads and caches them; :class:`AvroEncoder` turns a JSON payload into ``C3 01`` + the 8-byte little-endian
CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form + the Avro binary body.

JSON to Avro mapping. Validation is strict: nothing is coerced, every mismatch is a PayloadInvalidError.

- null: only ``null``. boolean: only ``true`` / ``false``. string: only strings.
- int / long: JSON integers in the signed 32 / 64-bit range; not booleans, not numbers with a fraction or
  an exponent (``1.0`` fails; orjson reads integers beyond 64 bits as floats, so those fail too).
- float / double: any JSON number; float rejects magnitudes above 3.4e38 (they would become infinity).
- bytes / fixed: a string of code points U+0000..U+00FF, one byte each (ISO-8859-1), as in Avro's JSON
  encoding and in bytes defaults of schemas; fixed needs exactly ``size`` of them. enum: one of its symbols.
- array: a JSON array; map: a JSON object; items and values are checked one by one.
- record: a JSON object. Fields without a default must be present; a field with a default may be left out
  (the default is written), but ``null`` does not mean "left out". Keys that are not fields are an error.
- union: a plain JSON value (not the Avro-JSON ``{"type": value}`` tag), written with the first branch in
  schema order that accepts it: ``["int", "long"]`` writes 5 as int and 2**40 as long.
- logical types are their underlying type: timestamp-*, time-* and date take integers, uuid a string, decimal
  its two's-complement bytes as above.

Errors name the event type, version, field path (``items[2].quantity``; map values by position,
``attrs{#0}``, as map keys are data) and JSON types, never a payload value; an unknown key is named only if it
is an Avro name. A schema file that is missing, unreadable, not valid Avro, not a record named after its event
type, or with a default that does not fit its field is a SchemaNotFoundError: the event goes to the DLQ
(``schema_not_found``) and the stream goes on. Failures are not cached, so a fixed file is picked up.

Each schema is compiled once into straight-line Python that validates and writes in one pass; its output is
byte-for-byte what ``fastavro.schemaless_writer`` writes (the tests check it). A schema file is data from a
pull request, so it must never become code: fastavro's parser lets a fixed's ``size`` be any JSON value and
names be any string, hence every attribute the generator reads is type-checked first (:func:`_check`: size an
integer >= 0, names Avro names, symbols a list of them), and the generated source holds only names and
numbers the generator made itself; every value taken from the schema reaches it through its namespace.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from cdc.errors import PayloadInvalidError, SchemaNotFoundError

__all__ = [
    "CONFLUENT_MAGIC",
    "MAGIC",
    "SCHEMA_FILE",
    "AvroEncoder",
    "EncodeFn",
    "Payload",
    "SchemaStore",
    "StoredSchema",
    "confluent_header",
    "split_confluent",
]

MAGIC: Final = b"\xc3\x01"  # the marker of Avro single-object encoding
CONFLUENT_MAGIC: Final = b"\x00"  # the Confluent wire format: this byte, the 4-byte schema id, the body

EncodeFn = Callable[[Any, bytearray], None]
Payload = bytes | bytearray | memoryview | str
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FULLNAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
SCHEMA_FILE: Final = re.compile(r"v[1-9][0-9]*\.avsc\Z")  # v<N>.avsc, N from 1, no leading zeros


@dataclass(frozen=True)
class StoredSchema:
    """One loaded schema file. ``parsed`` is fastavro's parsed form (usable with its reader and writer)."""

    event_type: str
    version: int
    path: Path
    parsed: Any
    canonical: str  # Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO of ``canonical``: 8 bytes, little-endian, as in single-object encoding
    text: str = ""  # the file's JSON, compacted: what a registry gets (the canonical form drops defaults)


class SchemaStore:
    """Schemas from ``<schemas_dir>/<event_type>/v<N>.avsc``, loaded on first use and cached."""

    def __init__(self, schemas_dir: str | os.PathLike[str]) -> None:
        self.schemas_dir = Path(schemas_dir)
        self._cache: dict[tuple[str, int], StoredSchema] = {}
        self._by_fingerprint: dict[bytes, StoredSchema] = {}

    def get(self, event_type: str, version: int) -> StoredSchema:
        """The schema of ``event_type`` / ``version``; SchemaNotFoundError when it is missing or invalid."""
        if (hit := self._cache.get((event_type, version))) is not None:
            return hit
        if not isinstance(event_type, str) or not _NAME.match(event_type):
            raise SchemaNotFoundError(f"event type {str(event_type)[:64]!r} is not a valid schema name")
        if type(version) is not int or version < 1:
            raise SchemaNotFoundError(f"{event_type}: schema version must be an integer >= 1")
        what, path = f"{event_type} v{version}", self.schemas_dir / event_type / f"v{version}.avsc"
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise SchemaNotFoundError(f"no schema for {what}: {path} does not exist") from None
        except OSError as exc:
            raise SchemaNotFoundError(f"schema for {what}: cannot read {path}: {exc.strerror}") from exc
        try:
            source = orjson.loads(text)
            parsed = parse_schema(source)
            canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {path} is not valid Avro: {exc}") from exc
        if not (
            isinstance(parsed, dict)
            and parsed.get("type") == "record"
            and str(parsed.get("name")).rpartition(".")[2] == event_type
        ):
            raise SchemaNotFoundError(f"schema for {what} in {path} must be a record named {event_type!r}")
        fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
        stored = StoredSchema(event_type, version, path, parsed, canonical, fp, orjson.dumps(source).decode())
        self._cache[(event_type, version)] = stored
        known = self._by_fingerprint.get(fp)  # equal canonical forms: the lowest (event type, version) wins
        if known is None or (event_type, version) < (known.event_type, known.version):
            self._by_fingerprint[fp] = stored
        return stored

    def available(self) -> list[tuple[str, int]]:
        """Every ``(event_type, version)`` that has a file in the directory, sorted; files are not parsed."""
        return sorted(
            (f.parent.name, int(f.stem[1:]))
            for f in self.schemas_dir.glob("*/v*.avsc")
            if _NAME.match(f.parent.name) and SCHEMA_FILE.match(f.name) and f.is_file()
        )

    def by_fingerprint(self, fp: bytes) -> tuple[str, int]:
        """``(event_type, version)`` of the schema with this fingerprint (8 bytes, little-endian CRC-64-AVRO).

        A miss scans the directory: new files are found, files that fail to load are skipped and counted.
        """
        fp = bytes(fp)
        if (hit := self._by_fingerprint.get(fp)) is None:
            for key in self.available():
                with contextlib.suppress(SchemaNotFoundError):
                    self.get(*key)
            hit = self._by_fingerprint.get(fp)
        if hit is None:
            broken = sum(key not in self._cache for key in self.available())
            note = f" ({broken} schema files could not be loaded)" if broken else ""
            raise SchemaNotFoundError(f"no schema in {self.schemas_dir} has fingerprint {fp.hex()}{note}")
        return hit.event_type, hit.version


def confluent_header(schema_id: int) -> bytes:
    """The prefix of a Confluent-framed value (ids come from the registry: :mod:`cdc.registry`)."""
    return CONFLUENT_MAGIC + struct.pack(">I", schema_id)


def split_confluent(value: bytes) -> tuple[int, memoryview]:
    """``(schema id, body)`` of a Confluent-framed value; ValueError when it is not one."""
    if len(value) < 5 or value[0] != 0:
        raise ValueError("not Confluent-framed (magic byte 0 + 4-byte schema id)")
    schema_id: int = struct.unpack_from(">I", value, 1)[0]
    return schema_id, memoryview(value)[5:]


class AvroEncoder:
    """JSON payload -> Avro, strictly validated (module docstring); one compiled encoder per schema."""

    def __init__(self, store: SchemaStore) -> None:
        self.store = store
        self._compiled: dict[tuple[str, int], tuple[bytes, EncodeFn, str]] = {}

    def encode(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """Single-object encoding ``C3 01`` + fingerprint + body; SchemaNotFoundError, PayloadInvalidError."""
        key = (event_type, schema_version)
        header, fn, what = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, payload, bytearray(header))

    def encoder_for(
        self, event_type: str, schema_version: int, *, header: bytes | None = None
    ) -> Callable[[Payload], bytes]:
        """``encode`` bound to one schema, for callers that route many events of the same type: the
        per-event cost is then the parse, the validation and the writing alone. ``header`` replaces the
        single-object prefix (Confluent framing: ``00`` + schema id)."""
        single_object, fn, what = self._compiled.get((event_type, schema_version)) or self._compile(
            (event_type, schema_version)
        )
        header = single_object if header is None else header

        def encode(payload: Payload) -> bytes:
            return _run(fn, what, payload, bytearray(header))

        return encode

    def encode_body(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """The bare Avro binary body, for other framings (Confluent: ``00`` + schema id + body)."""
        key = (event_type, schema_version)
        _, fn, what = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, payload, bytearray())

    def _compile(self, key: tuple[str, int]) -> tuple[bytes, EncodeFn, str]:
        stored = self.store.get(*key)
        what = f"{stored.event_type} v{stored.version}"
        try:
            _check(stored.parsed, "", set())
        except _BadSchema as exc:
            raise SchemaNotFoundError(
                f"schema for {what} in {stored.path} is not valid Avro: {exc}"
            ) from None
        try:
            fn = _build(stored.parsed, stored.parsed.get("__named_schemas", {}), {}, set())
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {stored.path} cannot be used: {exc}") from exc
        entry = self._compiled[key] = (MAGIC + stored.fingerprint, fn, what)
        return entry


def _run(fn: EncodeFn, what: str, payload: Payload, out: bytearray) -> bytes:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:  # its text is a reason and a position, never a quote of the input
        raise PayloadInvalidError(f"{what}: payload is not valid JSON: {exc}") from exc
    try:
        fn(value, out)
    except _Invalid as exc:
        raise PayloadInvalidError(f"{what}: {exc.render()}") from None
    except RecursionError:
        raise PayloadInvalidError(f"{what}: payload is nested too deeply to encode") from None
    return bytes(out)


# --- helpers of the generated code --------------------------------------------------------------------------

_DISPATCH: Final = {  # Python type name of a JSON value: its JSON name. Unions test the types in this order.
    "str": "string",
    "dict": "object",
    "int": "integer",
    "NoneType": "null",
    "float": "number",
    "list": "array",
    "bool": "boolean",
}


class _Invalid(Exception):
    def __init__(self, path: tuple[object, ...], problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = path, problem

    def render(self, whole: str = "payload") -> str:  # path: field names, array indexes, map positions "{#N}"
        text = "".join(f"[{p}]" if type(p) is int else f".{p}".replace(".{", "{") for p in self.path)
        return f"field '{text.lstrip('.')}' {self.problem}" if self.path else f"{whole} {self.problem}"


def _bad(path: tuple[object, ...], expected: str, value: object, ranged: tuple[type, ...] = ()) -> _Invalid:
    """``value`` does not fit; when its type is in ``ranged``, the type was right but the number too large."""
    got = _DISPATCH.get(type(value).__name__, "object") + (" out of range" if type(value) in ranged else "")
    return _Invalid(path, f"expects {expected}, got {got}")


def _unknown(path: tuple[object, ...], value: dict[str, object], known: frozenset[str]) -> _Invalid:
    extra = [k for k in value if k not in known]
    if extra and _NAME.match(extra[0]) and len(extra[0]) <= 64:
        return _Invalid((*path, extra[0]), f"is not in the schema ({len(extra)} unknown field(s))")
    return _Invalid(path, f"has {len(extra)} unknown field(s) (names not shown: not valid Avro names)")


_VI: Final = [bytes((z,) if z < 128 else ((z & 0x7F) | 0x80, z >> 7)) for z in range(1 << 14)]  # a varint
_VC: Final = [bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)]  # 14 bits, more to come


def _varint(z: int) -> bytes:
    return _VC[z & 0x3FFF] + _varint(z >> 14) if z >= 1 << 14 else _VI[z]


_pf, _pd = struct.Struct("<f").pack, struct.Struct("<d").pack
_RUNTIME: Final = {name: globals()[name] for name in "_VI _VC _varint _Invalid _bad _unknown _pf _pd".split()}

# --- code generation ----------------------------------------------------------------------------------------

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


class _BadSchema(ValueError):  # an attribute the generator reads has the wrong type or form
    pass


def _json_type(value: object) -> str:
    return _DISPATCH.get(type(value).__name__, "object")


def _what(value: object) -> str:  # what a value that is not a name is, without its text
    return "string that is not one" if isinstance(value, str) else _json_type(value)


def _check(schema: Any, at: str, seen: set[int]) -> None:
    """Everything of ``schema`` (fastavro's parsed form) the generator reads, type-checked: fastavro accepts a
    fixed's size of any type and names of any text. ``at`` is the attribute path; the message names it, never
    the attribute's text, which may be anything."""
    if isinstance(schema, list):
        for i, branch in enumerate(schema):
            _check(branch, f"{at}[{i}]", seen)
        return
    if not isinstance(schema, dict) or id(schema) in seen:
        return  # a primitive or a named type's name: fastavro resolved it; a definition is checked once
    seen.add(id(schema))
    kind, dot = schema.get("type"), f"{at}." if at else ""
    if not isinstance(kind, str):
        return _check(kind, f"{dot}type", seen)
    if kind in ("record", "error", "enum", "fixed"):
        name = schema.get("name")
        if not (isinstance(name, str) and _FULLNAME.match(name)):
            raise _BadSchema(
                f"{dot}name of a {kind} must be a dot-separated Avro name ([A-Za-z_][A-Za-z0-9_]* each, "
                f"namespace included), got {_what(name)}"
            )
    if kind in ("record", "error"):
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise _BadSchema(f"{dot}fields must be an array, got {_json_type(fields)}")
        names: set[str] = set()
        for i, f in enumerate(fields):
            fname = f.get("name") if isinstance(f, dict) else None
            if not (isinstance(fname, str) and _NAME.match(fname)):
                raise _BadSchema(
                    f"{dot}fields[{i}].name must be an Avro name ([A-Za-z_][A-Za-z0-9_]*), got {_what(fname)}"
                )
            if fname in names:
                raise _BadSchema(f"{dot}fields[{i}].name {fname!r} is the name of an earlier field")
            names.add(fname)
            _check(f["type"], f"{dot}fields[{i}].type", seen)
    elif kind == "enum":
        symbols = schema.get("symbols")
        if not (isinstance(symbols, list) and all(isinstance(v, str) and _NAME.match(v) for v in symbols)):
            raise _BadSchema(f"{dot}symbols must be an array of Avro names, got {_json_type(symbols)}")
    elif kind == "fixed":
        size = schema.get("size")
        if type(size) is not int or size < 0:
            got = "integer below 0" if type(size) is int else _json_type(size)
            raise _BadSchema(f"{dot}size must be an integer >= 0, got {got}")
    elif kind == "array":
        _check(schema.get("items"), f"{dot}items", seen)
    elif kind == "map":
        _check(schema.get("values"), f"{dot}values", seen)


def _build(schema: Any, named: dict[str, Any], defaults: _Defaults, recursive: set[str]) -> EncodeFn:
    while True:
        gen = _Gen(named, defaults, recursive)
        try:
            name = gen.function(schema)
        except _Restart:
            continue
        exec(compile("\n".join(gen.src), "<cdc.encode generated>", "exec"), gen.ns)  # source made by _Gen
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
        self.ns: dict[str, Any] = {**_RUNTIME, "_D": defaults}
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
        sym = self.new("_S", {v: _VI[i << 1] for i, v in enumerate(s["symbols"])}) if kind == "enum" else ""
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
                        _build(f["type"], self.named, self.defaults, self.recursive)(f["default"], out)
                    except _Invalid as exc:
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
        for pytype, json_type in _DISPATCH.items():
            cands = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS[k].split()]
            if cands:
                w(ind, f"{kw} " + (f"{x} is None:" if pytype == "NoneType" else f"type({x}) is {pytype}:"))
                kw = "elif"
            if len(cands) == 1:
                w(ind + 1, f"out += {_VI[cands[0] << 1]!r}")
                self.emit(branches[cands[0]], x, path, ind + 1, blocks, lab)
            elif cands:
                m, ok = self.new("m"), self.new("ok")
                w(ind + 1, f"{m} = len(out); {ok} = False")
                for i in cands:
                    w(ind + 1, f"if not {ok}:", "    try:", f"        out += {_VI[i << 1]!r}")
                    self.emit(branches[i], x, path, ind + 3, blocks + 2, lab)
                    w(ind + 2, f"    {ok} = True", f"except _Invalid: del out[{m}:]")
                problem = self.const(
                    f"expects {self.ns[lab]}, got {json_type} that fits none of its branches"
                )
                w(ind + 1, f"if not {ok}: raise _Invalid({_tup(path)}, {problem})")
        w(ind, f"else: raise _bad({_tup(path)}, {lab}, {x})")
