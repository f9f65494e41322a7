"""Encode stage: an outbox payload (JSON) becomes Avro, framed as single-object encoding.

Schemas live in ``<schemas_dir>/<event_type>/v<N>.avsc`` (see ``schemas/README.md``). :class:`SchemaStore` loads
them lazily and caches them; :class:`AvroEncoder` turns a JSON payload into ``C3 01`` + the 8-byte little-endian
CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form + the Avro binary body.

JSON to Avro mapping. Validation is strict: nothing is coerced, every mismatch is a PayloadInvalidError.

- null: only ``null``; boolean: only ``true`` / ``false``.
- int / long: JSON integers in the signed 32 / 64-bit range; never booleans, never numbers with a fraction or an
  exponent (``1.0`` is rejected; orjson reads integers beyond 64 bits as floats, so those are rejected too).
- float / double: any JSON number; float rejects magnitudes above 3.4e38 (they would turn into infinity).
- string: JSON strings only.
- bytes / fixed: a JSON string of code points U+0000..U+00FF, one byte each (ISO-8859-1), the convention of Avro's
  own JSON encoding and of byte defaults in schemas; fixed needs exactly ``size`` of them.
- enum: a JSON string that is one of its symbols.
- array: a JSON array; map: a JSON object; items and values are checked one by one.
- record: a JSON object. Every field without a default must be present. A field with a default may be left out
  (its default is written), but ``null`` does not mean "left out". Keys that are not fields are an error.
- union: a plain JSON value (no Avro-JSON ``{"type": value}`` tag); it is written with the first branch, in schema
  order, that accepts it: ``["int", "long"]`` writes 5 as int and 2**40 as long.
- logical types are their underlying type: timestamp-*, time-* and date take integers, uuid a string, decimal
  the two's-complement bytes as above.

Error messages name the event type, the version, the field path (``items[2].quantity``; map values are named by
position, ``attrs{#0}``, because map keys are data) and JSON types, never a value from the payload. An unknown
key is named only when it is a valid Avro name.

A schema file that is missing or unreadable, does not parse, is not a record named after its event type, or has a
default that does not fit its field raises SchemaNotFoundError, so the event goes to the dead-letter topic with
reason ``schema_not_found`` and the stream goes on; nothing negative is cached, so a fixed file is picked up.

Speed: each schema is compiled once into straight-line Python that validates and writes in one pass (varints
from lookup tables). Its output is byte-for-byte what ``fastavro.schemaless_writer`` writes; the tests check it.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import parse_schema, to_parsing_canonical_form

from cdc.errors import PayloadInvalidError, SchemaNotFoundError

__all__ = ["MAGIC", "AvroEncoder", "EncodeFn", "Payload", "SchemaStore", "StoredSchema"]

MAGIC: Final = b"\xc3\x01"
"""The two marker bytes of Avro single-object encoding."""

EncodeFn = Callable[[Any, bytearray], None]
Payload = bytes | bytearray | memoryview | str
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VERSION_FILE: Final = re.compile(r"v([1-9][0-9]*)\.avsc\Z")


@dataclass(frozen=True)
class StoredSchema:
    """One loaded schema file. ``parsed`` is fastavro's parsed form (usable with fastavro's reader/writer)."""

    event_type: str
    version: int
    path: Path
    parsed: Any
    canonical: str  # Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO of ``canonical``, 8 bytes, little-endian (as in single-object encoding)


class SchemaStore:
    """Schemas from ``<schemas_dir>/<event_type>/v<N>.avsc``, loaded on first use and cached."""

    def __init__(self, schemas_dir: str | os.PathLike[str]) -> None:
        self.schemas_dir = Path(schemas_dir)
        self._cache: dict[tuple[str, int], StoredSchema] = {}
        self._by_fingerprint: dict[bytes, StoredSchema] = {}

    def path_for(self, event_type: str, version: int) -> Path:
        return self.schemas_dir / event_type / f"v{version}.avsc"

    def get(self, event_type: str, version: int) -> StoredSchema:
        """The schema for ``event_type`` / ``version``; SchemaNotFoundError when it is missing or invalid."""
        hit = self._cache.get((event_type, version))
        if hit is not None:
            return hit
        if not isinstance(event_type, str) or not _NAME.match(event_type):
            raise SchemaNotFoundError(f"event type {str(event_type)[:64]!r} is not a valid schema name")
        if type(version) is not int or version < 1:
            raise SchemaNotFoundError(f"{event_type}: schema version must be an integer >= 1")
        what, path = f"{event_type} v{version}", self.path_for(event_type, version)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise SchemaNotFoundError(f"no schema for {what}: {path} does not exist") from None
        except OSError as exc:
            raise SchemaNotFoundError(f"schema for {what}: cannot read {path}: {exc.strerror}") from exc
        try:
            parsed = parse_schema(orjson.loads(text))
            canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {path} is not a valid Avro schema: {exc}") from exc
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            raise SchemaNotFoundError(f"schema for {what} in {path} is not an Avro record")
        if str(parsed.get("name", "")).rpartition(".")[2] != event_type:
            raise SchemaNotFoundError(f"schema for {what} in {path} must be a record named {event_type!r}")
        fp = bytes.fromhex(_fastavro_fingerprint(canonical, "CRC-64-AVRO"))
        stored = StoredSchema(event_type, version, path, parsed, canonical, fp)
        self._cache[(event_type, version)] = stored
        known = self._by_fingerprint.get(fp)  # equal canonical forms: the lowest (event type, version) wins
        if known is None or (event_type, version) < (known.event_type, known.version):
            self._by_fingerprint[fp] = stored
        return stored

    def available(self) -> list[tuple[str, int]]:
        """Every ``(event_type, version)`` with a file in the directory, sorted (files are not parsed)."""
        found: list[tuple[str, int]] = []
        if self.schemas_dir.is_dir():
            for sub in self.schemas_dir.iterdir():
                if sub.is_dir() and _NAME.match(sub.name):
                    for f in sub.iterdir():
                        if (m := _VERSION_FILE.match(f.name)) is not None and f.is_file():
                            found.append((sub.name, int(m.group(1))))
        return sorted(found)

    def by_fingerprint(self, fp: bytes) -> tuple[str, int]:
        """``(event_type, version)`` of the schema whose CRC-64-AVRO fingerprint (little-endian) is ``fp``.

        Scans the directory on a miss, so schemas added since are found; files that fail to load are skipped
        and counted in the error.
        """
        fp = bytes(fp)
        hit = self._by_fingerprint.get(fp)
        broken = 0
        if hit is None:
            for event_type, version in self.available():
                try:
                    self.get(event_type, version)
                except SchemaNotFoundError:
                    broken += 1
            hit = self._by_fingerprint.get(fp)
        if hit is None:
            note = f" ({broken} schema files could not be loaded)" if broken else ""
            raise SchemaNotFoundError(f"no schema in {self.schemas_dir} has fingerprint {fp.hex()}{note}")
        return hit.event_type, hit.version


class AvroEncoder:
    """JSON payload -> Avro, strictly validated (module docstring), with one compiled encoder per schema."""

    def __init__(self, store: SchemaStore) -> None:
        self.store = store
        self._compiled: dict[tuple[str, int], tuple[bytes, EncodeFn, str]] = {}

    def encode(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """Single-object encoding: ``C3 01`` + fingerprint + body. SchemaNotFoundError / PayloadInvalidError."""
        key = (event_type, schema_version)
        header, fn, what = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, payload, bytearray(header))

    def encode_body(self, event_type: str, schema_version: int, payload: Payload) -> bytes:
        """The bare Avro binary body, for other framings (Confluent: ``00`` + schema id + body)."""
        key = (event_type, schema_version)
        _, fn, what = self._compiled.get(key) or self._compile(key)
        return _run(fn, what, payload, bytearray())

    def _compile(self, key: tuple[str, int]) -> tuple[bytes, EncodeFn, str]:
        stored = self.store.get(*key)
        what = f"{stored.event_type} v{stored.version}"
        try:
            fn = _build(stored.parsed, stored.parsed.get("__named_schemas", {}), {})
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {stored.path} cannot be used: {exc}") from exc
        entry = (MAGIC + stored.fingerprint, fn, what)
        self._compiled[key] = entry
        return entry


def _run(fn: EncodeFn, what: str, payload: Payload, out: bytearray) -> bytes:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:  # its message and position never quote the document
        raise PayloadInvalidError(f"{what}: payload is not valid JSON: {exc}") from exc
    try:
        fn(value, out)
    except _Invalid as exc:
        raise PayloadInvalidError(f"{what}: {exc.render()}") from None
    except (RecursionError, MemoryError) as exc:
        raise PayloadInvalidError(f"{what}: payload cannot be encoded ({type(exc).__name__})") from None
    return bytes(out)


# --- runtime helpers of the generated code ------------------------------------------------------------------


class _Invalid(Exception):
    def __init__(self, path: tuple[object, ...], problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = path, problem

    def render(self) -> str:
        if not self.path:
            return f"payload {self.problem}"
        text = "".join(f"[{p}]" if type(p) is int else str(p) if isinstance(p, _Entry) else f".{p}" for p in self.path)
        return f"field '{text.lstrip('.')}' {self.problem}"


class _Entry(int):
    """Position of a map entry in a path (map keys are data, so they are not shown)."""

    def __str__(self) -> str:
        return f"{{#{int(self)}}}"


_JSON_TYPES: Final = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value)) or ("array" if isinstance(value, list) else "object")


def _bad(path: tuple[object, ...], expected: str, value: object, ranged: tuple[type, ...] = ()) -> _Invalid:
    """``value`` does not fit; when its type is in ``ranged`` the type was right but the number too large."""
    got = f"{_json_type(value)} out of range" if type(value) in ranged else _json_type(value)
    return _Invalid(path, f"expects {expected}, got {got}")


def _bad_enum(path: tuple[object, ...], expected: str, value: object) -> _Invalid:
    got = "a string that is not one of them" if type(value) is str else _json_type(value)
    return _Invalid(path, f"expects one of the symbols of {expected}, got {got}")


def _unknown(path: tuple[object, ...], value: dict[str, object], known: frozenset[str]) -> _Invalid:
    extra = [k for k in value if k not in known]
    if extra and _NAME.match(extra[0]) and len(extra[0]) <= 64:
        return _Invalid((*path, extra[0]), f"is not in the schema ({len(extra)} unknown field(s))")
    return _Invalid(path, f"has {len(extra)} unknown field(s) (names not shown: not valid Avro names)")


def _varint_bytes(z: int) -> bytes:
    parts = []
    while z > 0x7F:
        parts.append((z & 0x7F) | 0x80)
        z >>= 7
    parts.append(z)
    return bytes(parts)


_VI: Final = [_varint_bytes(z) for z in range(1 << 14)]  # complete varints below 2**14
_VC: Final = [bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)]  # 14 bits, more to come


def _varint(z: int) -> bytes:
    out = bytearray()
    while z >= 1 << 14:
        out += _VC[z & 0x3FFF]
        z >>= 14
    return bytes(out + _VI[z])


_RUNTIME: Final = {"_VI": _VI, "_VC": _VC, "_varint": _varint, "_Invalid": _Invalid, "_Entry": _Entry, "_bad": _bad,
                   "_bad_enum": _bad_enum, "_unknown": _unknown, "_pf": struct.Struct("<f").pack, "_pd": struct.Struct("<d").pack}

# --- code generation ----------------------------------------------------------------------------------------

_PRIMITIVE: Final = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_KINDS: Final = _PRIMITIVE | {"record", "error", "enum", "array", "map", "fixed"}
_ACCEPTS: Final = {"null": "None", "boolean": "bool", "int": "int", "long": "int", "float": "int float",
                   "double": "int float", "bytes": "str", "string": "str", "enum": "str", "fixed": "str",
                   "array": "list", "map": "dict", "record": "dict", "error": "dict"}
_DISPATCH_ORDER: Final = ("str", "dict", "int", "None", "float", "list", "bool")
_MAX_BLOCKS: Final = 8  # Python allows 20 statically nested blocks per function; deeper parts get a function


class _Restart(Exception):
    """A record turned out to be recursive: compile again with a function for it."""


def _build(schema: Any, named: dict[str, Any], defaults: dict[int, bytes | None], recursive: set[str] | None = None) -> EncodeFn:
    recursive = set() if recursive is None else recursive
    while True:
        gen = _Gen(named, defaults, recursive)
        try:
            name = gen.function(schema)
        except _Restart:
            continue
        exec(compile("\n".join(gen.src), "<cdc.encode generated>", "exec"), gen.ns)  # noqa: S102 - our own code
        fn: EncodeFn = gen.ns[name]
        return fn


def _resolve(schema: Any, named: dict[str, Any]) -> tuple[str, Any]:
    """(kind, schema dict or union list) for any schema form: name, primitive, {"type": ...} or union."""
    while True:
        if isinstance(schema, list):
            return "union", schema
        if isinstance(schema, str):
            schema = {"type": schema} if schema in _PRIMITIVE else named[schema]
        kind = schema["type"]
        if isinstance(kind, str) and kind in _KINDS:
            return kind, schema
        schema = kind


def _label(kind: str, schema: Any) -> str:
    if kind in ("record", "error", "enum", "fixed"):
        return f"{kind} {str(schema['name']).rpartition('.')[2]}"
    return kind


class _Gen:
    def __init__(self, named: dict[str, Any], defaults: dict[int, bytes | None], recursive: set[str]) -> None:
        self.named, self.defaults, self.recursive = named, defaults, recursive
        self.ns: dict[str, Any] = {**_RUNTIME, "_D": defaults}
        self.src: list[str] = []
        self.lines: list[str] = []
        self.funcs: dict[str, str] = {}
        self.active: set[str] = set()
        self.count = 0

    def new(self, prefix: str, value: object = None) -> str:
        self.count += 1
        name = f"{prefix}{self.count}"
        if value is not None:
            self.ns[name] = value
        return name

    def w(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def function(self, schema: Any, record: str | None = None) -> str:
        name, saved = self.new("_f"), self.lines
        if record is not None:
            self.funcs[record] = name
        self.lines = [f"def {name}(x, out):"]
        kind, s = _resolve(schema, self.named)
        if record is not None:
            self.record(s, "x", [], 1, 0, _label(kind, s))
        else:
            self.emit(schema, "x", [], 1, 0)
        self.lines.append("    return None")
        self.src += self.lines
        self.lines = saved
        return name

    def call(self, fn: str, x: str, path: list[str], ind: int) -> None:
        if not path:
            return self.w(ind, f"{fn}({x}, out)")
        self.w(ind, f"try: {fn}({x}, out)")
        self.w(ind, f"except _Invalid as e: e.path = ({', '.join(path)},) + e.path; raise")

    def varint(self, ind: int) -> None:  # writes the varint of the local 'z' (>= 0)
        self.w(ind, "if z < 16384: out += _VI[z]")
        self.w(ind, "elif z < 268435456: out += _VC[z & 16383]; out += _VI[z >> 14]")
        self.w(ind, "else: out += _varint(z)")

    def emit(self, schema: Any, x: str, path: list[str], ind: int, blocks: int, label: str | None = None) -> None:
        kind, s = _resolve(schema, self.named)
        lab = label or (" or ".join(_label(*_resolve(b, self.named)) for b in s) if kind == "union" else _label(kind, s))
        p, w = f"({', '.join(path)}{',' if path else ''})", self.w
        bad = f"raise _bad({p}, {lab!r}, {x})"
        if kind in ("record", "error") and s["name"] in self.recursive:
            return self.call(self.funcs.get(s["name"]) or self.function(s, s["name"]), x, path, ind)
        if blocks >= _MAX_BLOCKS and kind in ("record", "error", "array", "map", "union"):
            return self.call(self.function(s), x, path, ind)
        if kind == "null":
            w(ind, f"if {x} is not None: {bad}")
        elif kind == "boolean":
            w(ind, f"if {x} is True: out += b'\\x01'")
            w(ind, f"elif {x} is False: out += b'\\x00'")
            w(ind, f"else: {bad}")
        elif kind in ("int", "long"):
            bits = 31 if kind == "int" else 63
            w(ind, f"if type({x}) is not int or not {-(1 << bits)} <= {x} <= {(1 << bits) - 1}:")
            w(ind + 1, f"raise _bad({p}, {lab!r}, {x}, (int,))")
            w(ind, f"z = ({x} << 1) ^ ({x} >> {bits})")
            self.varint(ind)
        elif kind in ("float", "double"):
            limit = " and -3.4028234663852886e38 <= {x} <= 3.4028234663852886e38" if kind == "float" else ""
            w(ind, f"if (type({x}) is float or type({x}) is int){limit.format(x=x)}: out += _p{kind[0]}({x})")
            w(ind, f"else: raise _bad({p}, {lab!r}, {x}, (int, float))")
        elif kind in ("string", "bytes", "fixed"):
            w(ind, f"if type({x}) is not str: {bad}")
            if kind == "string":
                w(ind, f"b = {x}.encode()")
            else:
                w(ind, f"try: b = {x}.encode('latin-1')")
                w(ind, f"except UnicodeEncodeError: raise _Invalid({p}, "
                  f"{'expects ' + lab + ' (code points U+0000..U+00FF), got other characters'!r}) from None")
            if kind == "fixed":
                w(ind, f"if len(b) != {int(s['size'])}: raise _Invalid({p}, "
                  f"{'expects ' + lab + ' of ' + str(s['size']) + ' bytes, got another length'!r})")
            else:
                w(ind, "z = len(b) << 1")
                self.varint(ind)
            w(ind, "out += b")
        elif kind == "enum":
            symbols = self.new("_S", {sym: _VI[i << 1] for i, sym in enumerate(s["symbols"])})
            w(ind, f"b = {symbols}.get({x}) if type({x}) is str else None")
            w(ind, f"if b is None: raise _bad_enum({p}, {lab!r}, {x})")
            w(ind, "out += b")
        elif kind in ("array", "map"):
            i, y = self.new("i"), self.new("y")
            w(ind, f"if type({x}) is not {'list' if kind == 'array' else 'dict'}: {bad}")
            w(ind, f"if {x}:")
            w(ind + 1, f"z = len({x}) << 1")
            self.varint(ind + 1)
            if kind == "array":
                w(ind + 1, f"for {i}, {y} in enumerate({x}):")
                self.emit(s["items"], y, [*path, i], ind + 2, blocks + 1)
            else:
                w(ind + 1, f"for {i}, ({y}k, {y}) in enumerate({x}.items()):")
                w(ind + 2, f"b = {y}k.encode(); z = len(b) << 1")
                self.varint(ind + 2)
                w(ind + 2, "out += b")
                self.emit(s["values"], y, [*path, f"_Entry({i})"], ind + 2, blocks + 1)
            w(ind, "out += b'\\x00'")
        elif kind == "union":
            self.union(s, x, path, ind, blocks, lab)
        else:
            if s["name"] in self.active:
                self.recursive.add(s["name"])
                raise _Restart
            self.active.add(s["name"])
            self.record(s, x, path, ind, blocks, lab)
            self.active.discard(s["name"])

    def record(self, s: Any, x: str, path: list[str], ind: int, blocks: int, lab: str) -> None:
        p, w, fields = f"({', '.join(path)}{',' if path else ''})", self.w, s["fields"]
        w(ind, f"if type({x}) is not dict: raise _bad({p}, {lab!r}, {x})")
        d = self.new("d")
        if any("default" in f for f in fields):
            w(ind, f"{d} = 0")
        for f in fields:
            y, fpath = self.new("y"), [*path, repr(f["name"])]
            if "default" in f:
                if id(f) not in self.defaults:
                    self.defaults[id(f)] = None  # placeholder while a recursive default compiles
                    self.defaults[id(f)] = self.encode_default(f, lab)
                w(ind, f"if {f['name']!r} in {x}:")
                w(ind + 1, f"{y} = {x}[{f['name']!r}]")
                self.emit(f["type"], y, fpath, ind + 1, blocks)
                w(ind, f"else: out += _D[{id(f)}]; {d} += 1")
            else:
                w(ind, f"try: {y} = {x}[{f['name']!r}]")
                w(ind, f"except KeyError: raise _Invalid(({', '.join(fpath)},), 'is required but missing') from None")
                self.emit(f["type"], y, fpath, ind, blocks)
        count = f"len({x}) + {d}" if any("default" in f for f in fields) else f"len({x})"
        known = self.new("_K", frozenset(f["name"] for f in fields))
        w(ind, f"if {count} != {len(fields)}: raise _unknown({p}, {x}, {known})")

    def encode_default(self, field: Any, record: str) -> bytes:
        out = bytearray()
        try:
            _build(field["type"], self.named, self.defaults, self.recursive)(field["default"], out)
        except _Invalid as exc:
            problem = f"the default of field {field['name']!r} of {record} does not fit its type"
            raise ValueError(f"{problem}: {exc.render()}") from None
        return bytes(out)

    def union(self, branches: list[Any], x: str, path: list[str], ind: int, blocks: int, lab: str) -> None:
        p, w = f"({', '.join(path)}{',' if path else ''})", self.w
        kinds = [_resolve(b, self.named)[0] for b in branches]
        first = True
        for pytype in _DISPATCH_ORDER:
            cands = [i for i, k in enumerate(kinds) if pytype in _ACCEPTS[k].split()]
            if not cands:
                continue
            test = f"{x} is None" if pytype == "None" else f"type({x}) is {pytype}"
            w(ind, f"{'if' if first else 'elif'} {test}:")
            first = False
            if len(cands) == 1:
                w(ind + 1, f"out += {_VI[cands[0] << 1]!r}")
                self.emit(branches[cands[0]], x, path, ind + 1, blocks, lab)
                continue
            m, ok = self.new("m"), self.new("ok")
            w(ind + 1, f"{m} = len(out); {ok} = False")
            for i in cands:
                w(ind + 1, f"if not {ok}:")
                w(ind + 2, "try:")
                w(ind + 3, f"out += {_VI[i << 1]!r}")
                self.emit(branches[i], x, path, ind + 3, blocks + 2)
                w(ind + 3, f"{ok} = True")
                w(ind + 2, f"except _Invalid: del out[{m}:]")
            problem = f"expects {lab}, got {pytype.replace('None', 'null')} that fits none of its branches"
            w(ind + 1, f"if not {ok}: raise _Invalid({p}, {problem!r})")
        w(ind, f"else: raise _bad({p}, {lab!r}, {x})")
