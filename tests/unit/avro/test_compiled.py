"""The compiled encoder (cdc._fastpath) against the Python reference, byte for byte and error for error.

Every payload goes through both; they must give the same bytes, or the same exception with the same message
(the compiled encoder calls the reference for anything it is not sure of). The payloads: the project's
schemas and generated ones covering every kind the compiled encoder takes, with random valid values written
by orjson and by json (escapes, key orders, whitespace), then each mutated (a value of another JSON type, a
number at or past a range's end, a key left out, doubled or unknown, broken text). Without the extension a
developer's run skips; under CI=true, where `make install` builds it, that is a failure.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastavro import parse_schema

from cdc.avro import compiled
from cdc.avro.encoder import MAGIC, AvroEncoder
from cdc.avro.store import SchemaStore

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"

pytestmark = pytest.mark.usefixtures("compiled_extension")


WIDE = {
    "type": "record",
    "name": "Wide",
    "namespace": "t",
    "fields": [
        {"name": "n", "type": "null"},
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {
            "name": "inner",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [
                    {"name": "x", "type": "int", "default": 7},
                    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["a"]},
                    {"name": "c", "type": "Color", "default": "BLUE"},
                ],
            },
        },
        {"name": "u1", "type": ["null", "string"], "default": None},
        {"name": "u2", "type": ["string", "null", "long", "boolean"], "default": "dflt"},
        {"name": "u3", "type": ["null", "double", {"type": "array", "items": "Inner"}], "default": None},
        {"name": "u4", "type": ["null", "Inner"], "default": None},
        {"name": "fl", "type": ["null", "float"], "default": None},
        {"name": "opt", "type": "long", "default": -3},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "at",
            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
            "default": None,
        },
    ],
}


def _schemas() -> list[tuple[str, Any]]:
    out = []
    for path in sorted(SCHEMAS.glob("*/v*.avsc")):
        out.append((f"{path.parent.name} {path.stem}", json.loads(path.read_text())))
    out.append(("generated Wide", WIDE))
    return out


def _value(schema: Any, named: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    if isinstance(schema, list):
        return _value(rng.choice(schema), named, rng, depth)
    if isinstance(schema, str):
        if schema in named:
            return _value(named[schema], named, rng, depth)
        schema = {"type": schema}
    kind = schema["type"]
    if isinstance(kind, (list, dict)):
        return _value(kind, named, rng, depth)
    logical = schema.get("logicalType")
    if logical and rng.random() < 0.5:  # their strings are the reference's to read: it gets them
        return {"date": "2026-12-04", "timestamp-millis": "2026-12-04T19:25:54.123+00:00"}.get(
            logical, "12:00:00"
        )
    if "name" in schema:
        named[schema["name"]] = schema
        named[f"{schema.get('namespace', 't')}.{schema['name']}"] = schema
    match kind:
        case "null":
            return None
        case "boolean":
            return rng.random() < 0.5
        case "int":
            return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)])
        case "long":
            return rng.choice(
                [0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1), rng.randint(-99, 99)]
            )
        case "float" | "double":
            numbers = [
                0.0,
                -0.0,
                1.5,
                rng.uniform(-1e6, 1e6),
                rng.randint(-5, 5),
                3.4028234663852886e38,
                1e-45,
            ]
            return rng.choice(numbers + [1e300] if kind == "double" else numbers)
        case "string":
            return rng.choice(["", "abc", "é€😀", 'q"\\/\n\t\x00\x1f', "x" * rng.randint(0, 300), "\u2028"])
        case "bytes":
            return "".join(chr(rng.randint(0, 255)) for _ in range(rng.randint(0, 12)))
        case "fixed":
            return "".join(chr(rng.randint(0, 255)) for _ in range(schema["size"]))
        case "enum":
            return rng.choice(schema["symbols"])
        case "array":
            return [
                _value(schema["items"], named, rng, depth + 1)
                for _ in range(rng.randint(0, 3 if depth < 3 else 0))
            ]
        case "record":
            record = {}
            for f in schema["fields"]:
                if "default" in f and rng.random() < 0.3:
                    continue  # left out: the default is written
                record[f["name"]] = _value(f["type"], named, rng, depth + 1)
            return record
    raise AssertionError(kind)


def _renderings(value: Any, rng: random.Random) -> list[bytes | str]:
    shuffled = value
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        shuffled = dict(items)
    jsonb = (
        dict(sorted(value.items(), key=lambda kv: (len(kv[0]), kv[0]))) if isinstance(value, dict) else value
    )
    return [
        _compact(value),
        json.dumps(shuffled, ensure_ascii=True).encode(),  # \u escapes, surrogate pairs
        json.dumps(shuffled, ensure_ascii=False, indent=rng.choice([None, 1])),  # str, spaces and newlines
        _compact(jsonb),  # jsonb's key order: by length, then bytes
    ]


def _compact(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, separators=(",", ":")).encode()


_SWAPS: list[Any] = [
    None,
    True,
    0,
    -1,
    1.0,
    1e5,
    "s",
    [],
    {},
    2**31,
    -(2**31) - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    3.5e38,
]


def _corruptions(text: bytes, rng: random.Random) -> list[bytes]:
    """The text of a valid payload with its structure broken at one place (a separator or bracket left
    out, doubled, or swapped for another), or a number written otherwise."""
    marks = [i for i, c in enumerate(text) if c in b',:[]{}"']
    out = []
    for _ in range(3):
        i = rng.choice(marks)
        out.append(text[:i] + text[i + 1 :])
        out.append(text[:i] + text[i : i + 1] * 2 + text[i + 1 :])
        out.append(text[:i] + bytes([rng.choice(b',:[]{}"')]) + text[i + 1 :])
    # Numbers written otherwise: a leading zero or sign, a fraction or an exponent where there was none.
    digits = [i for i, c in enumerate(text) if c in b"0123456789"]
    for i in rng.sample(digits, min(3, len(digits))):
        out.append(text[:i] + rng.choice([b"0", b"00", b"+", b"-", b".", b"e", b"E+", b".5e1"]) + text[i:])
    return out


def _mutations(value: Any, rng: random.Random) -> list[Any]:
    """Values near ``value``: one leaf or key changed, as a producer's bug would."""
    out = []
    for _ in range(6):
        v = json.loads(json.dumps(value))
        path: list[Any] = []
        node = v
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        action = rng.random()
        if isinstance(parent, dict) and action < 0.15:
            del parent[key]
        elif isinstance(parent, dict) and action < 0.25:
            parent["zz_unknown"] = 1
        else:
            parent[key] = rng.choice(_SWAPS)
        out.append(v)
    return out


_BROKEN_TEXT = [
    b"",
    b"not json",
    b"\xff",
    b"[1]",
    b"null",
    b'{"a": 1,}',
    b'{"x": "\\ud800"}',
    b'{"x": "\\ud83d\\u0041"}',
    b'{"x": "\x01"}',
    b'{"x": 01}',
    b'{"x": 1} x',
    b'{"x": nul}',
    b'{"x": 1E400}',
    b'{"x": -0}',
    b'{"x": 1e5}',
    b'{"x": 18446744073709551616}',
    b'{"x": "\\u00"}',
    b'{"x": "\\q"}',
]


def _outcome(fn: Any, payload: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(payload))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize(("name", "schema"), _schemas(), ids=[n for n, _ in _schemas()])
def test_the_compiled_encoder_writes_what_the_reference_writes_or_lets_it_decide(
    name: str, schema: Any, tmp_path: Path
) -> None:
    rng = random.Random(f"compiled {name}")
    (tmp_path / schema["name"]).mkdir()
    (tmp_path / schema["name"] / "v1.avsc").write_text(json.dumps(schema))
    reference = AvroEncoder(SchemaStore(tmp_path), compiled=False).encoder_for(schema["name"], 1)
    fast = AvroEncoder(SchemaStore(tmp_path)).encoder_for(schema["name"], 1)
    assert type(fast).__name__ == "Encoder", f"{name}: the compiled encoder takes this schema"
    taken = valid = 0
    payloads: list[bytes | str] = list(_BROKEN_TEXT)
    for _ in range(300):
        value = _value(schema, {}, rng)
        for payload in _renderings(value, rng):
            payloads.append(payload)
            valid += 1
        for wrong in _mutations(value, rng):
            payloads.extend(_renderings(wrong, rng)[:2])
        payloads.extend(_corruptions(_compact(value), rng))
    for payload in payloads:
        expected = _outcome(reference, payload)
        assert _outcome(fast, payload) == expected, f"{name}: {payload!r}"
        if fast.compiled_only(payload) is not None:  # type: ignore[attr-defined]
            taken += 1
    # The valid payloads are mostly the compiled encoder's to write (it hands the time strings over).
    assert taken >= valid // 3, f"{name}: the compiled encoder wrote {taken} of {valid} valid payloads"


def test_the_project_schemas_are_taken_and_framed_as_the_reference_frames_them(tmp_path: Path) -> None:
    encoder = AvroEncoder(SchemaStore(SCHEMAS))
    payload = orjson.dumps(
        {
            "order_id": "o",
            "customer_id": "c",
            "amount_cents": 5,
            "currency": "EUR",
            "items": [],
            "coupon": "x",
        }
    )
    confluent = encoder.encoder_for("OrderPlaced", 2, header=b"\x00\x00\x00\x00\x07")
    assert confluent.compiled_only(payload)[:5] == b"\x00\x00\x00\x00\x07"  # type: ignore[attr-defined]
    single = encoder.encoder_for("OrderPlaced", 2)(payload)
    assert single.startswith(MAGIC) and single == AvroEncoder(SchemaStore(SCHEMAS), compiled=False).encode(
        "OrderPlaced", 2, payload
    )


@pytest.mark.parametrize(
    "field",
    [
        {"type": "map", "values": "long"},
        {"type": "bytes", "cdc.encoding": "base64"},
        {"type": "string", "logicalType": "uuid"},
        {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2},
        ["int", "long"],  # one JSON type fits two branches: the first that accepts the value wins
        {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
    ],
    ids=["map", "base64", "uuid", "decimal", "int-long-union", "recursive"],
)
def test_a_schema_with_a_part_the_compiled_encoder_does_not_take_keeps_the_reference(field: Any) -> None:
    schema = parse_schema({"type": "record", "name": "R", "fields": [{"name": "f", "type": field}]})
    assert compiled.program(schema) is None


class _Bytes(bytes):
    pass


class _Str(str):
    __slots__ = ()


class _ByteArray(bytearray):
    pass


class _Dict(dict[str, Any]):
    pass


class _List(list[Any]):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


_TEXT = b'{"order_id": "o", "customer_id": "c", "amount_cents": 5, "currency": "EUR", "items": []}'
_VALUE = orjson.loads(_TEXT)


@pytest.mark.parametrize(
    "payload",
    [
        _Bytes(_TEXT),
        _Str(_TEXT.decode()),
        _ByteArray(_TEXT),
        memoryview(_Bytes(_TEXT)),
        _VALUE,
        _Dict(_VALUE),
        [_VALUE],
        _List([_VALUE]),
        5,
        True,
        _Int(5),
        1.5,
        _Float(1.5),
        None,
    ],
    ids=lambda p: type(p).__name__,
)
def test_a_payload_the_reference_does_not_read_as_json_text_is_left_to_it(payload: Any) -> None:
    """orjson.loads takes exactly bytes, bytearray, memoryview and str: a subclass of bytes or str is no
    JSON to the reference (PayloadInvalidError), so the compiled encoder must not write it either; the
    reference alone decides, and a memoryview of such bytes it reads."""
    reference = AvroEncoder(SchemaStore(SCHEMAS), compiled=False).encoder_for("OrderPlaced", 1)
    fast = AvroEncoder(SchemaStore(SCHEMAS)).encoder_for("OrderPlaced", 1)
    assert fast.compiled_only(_TEXT) is not None  # type: ignore[attr-defined]  # the text itself it writes
    assert _outcome(fast, payload) == _outcome(reference, payload)
    assert fast.compiled_only(payload) is None  # type: ignore[attr-defined]
