"""The compiled outbox row reader (cdc._fastpath.RowReader) against the Python path it stands in for.

The Python path is ``decode_insert_tuple(data, offset=25)``, the outbox table's oid, then
``EventRouter.row_fields``. Wherever the compiled reader returns fields, the Python path must return the
same fields, type for type; wherever it returns None, the pipeline runs the Python path (which then skips the
row, dead-letters it or raises), so any outcome is allowed there, but it must return fields for the rows
that are plainly valid. Messages: captured pgoutput traffic of a real PostgreSQL, then generated Inserts of
outbox tables with their columns in random orders, with nulls, unchanged TOAST values, binary values, odd
versions and headers, cut short or with bytes to spare.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from cdc.errors import CdcError
from cdc.stream.pgoutput import decode_insert_tuple
from cdc.stream.route import EventRouter
from tests.unit.stream.test_pgoutput import CAPTURES, INDEX, records
from tests.unit.stream.test_route import relation, router

pytestmark = pytest.mark.usefixtures("compiled_extension")


FIELDS = ["id", "aggregate_type", "aggregate_id", "event_type", "schema_version", "payload", "headers"]


def _router(names: list[str], oid: int, *, table: str = "outbox", **columns: Any) -> EventRouter:
    overrides: dict[str, Any] = {"table": f"public.{table}"}
    if columns:
        overrides["columns"] = columns
    compiled = router(compiled=True, **overrides)
    compiled.relation(relation(names, oid=oid, name=table))
    assert compiled.row_reader is not None
    return compiled


def _python(router: EventRouter, data: bytes) -> Any:
    try:
        oid, values = decode_insert_tuple(data, offset=25)
    except CdcError as exc:
        return ("error", type(exc).__name__)
    if oid != router.outbox_oid:
        return ("not the outbox",)
    try:
        return ("fields", router.row_fields(values))
    except CdcError as exc:
        return ("error", type(exc).__name__)


def _check(router: EventRouter, data: bytes) -> bool:
    """Whether the compiled reader took the message; fails when it read other fields than Python."""
    assert router.row_reader is not None
    fields = router.row_reader(data)
    if fields is None:
        return False
    expected = _python(router, data)
    assert expected == ("fields", fields), data
    assert [type(f) for f in fields] == [type(f) for f in expected[1]]
    return True


def _envelope(body: bytes) -> bytes:
    return b"w" + struct.pack(">QQQ", 0x1000, 0x2000, 123) + body


def _insert(oid: int, cols: list[tuple[str, bytes | None]]) -> bytes:
    body = b"I" + struct.pack(">I", oid) + b"N" + struct.pack(">H", len(cols))
    for kind, value in cols:
        body += kind.encode()
        if value is not None:
            body += struct.pack(">I", len(value)) + value
    return _envelope(body)


def test_captured_traffic_reads_as_python_reads_it() -> None:
    taken = 0
    for name in CAPTURES:
        for captured in INDEX["relations"].values():
            names = [c["name"] if isinstance(c, dict) else c for c in captured.get("columns", [])]
            if not set(FIELDS[:4]) | {"payload"} <= set(names):
                continue
            router = _router(names, captured["oid"], table=captured.get("name", "outbox"))
            for data in records(name):
                if data[:1] == b"w" and len(data) > 25 and data[25] == 0x49:
                    taken += _check(router, data)
    assert taken > 0, "the captures hold outbox inserts the compiled reader takes"


@pytest.mark.parametrize("seed", range(4))
def test_generated_inserts_read_as_python_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    taken = valid = 0
    for _ in range(400):
        names = [*FIELDS, "created_at", "extra"]
        if rng.random() < 0.3:
            names.remove("schema_version")
        if rng.random() < 0.3:
            names.remove("headers")
        rng.shuffle(names)
        oid = rng.randint(1, 2**32 - 1)
        columns = {f: (f if f in names else False) for f in ("schema_version", "headers")}
        router = _router(names, oid, **columns)
        for _ in range(20):
            cols: list[tuple[str, bytes | None]] = []
            plain = True
            for n in names:
                value = {
                    "schema_version": rng.choice([b"1", b"2", b"12", b"007"]),
                    "headers": rng.choice([b'{"a": "b"}', b"[]", b""]),
                    "payload": b'{"x": 1}',
                }.get(n, rng.randbytes(rng.randint(0, 40)))
                roll = rng.random()
                if roll < 0.05:
                    cols.append(("n", None))
                    plain = plain and n in ("headers", "created_at", "extra")
                elif roll < 0.08:
                    cols.append(("u", None))
                    plain = False
                elif roll < 0.1:
                    cols.append(("b", value))
                    plain = False
                elif roll < 0.14 and n == "schema_version":
                    cols.append(("t", rng.choice([b"", b"x", b"-1", b"1.0", b" 1", "\u0663".encode()])))
                    plain = False
                else:
                    cols.append(("t", value))
            data = _insert(oid if rng.random() < 0.9 else oid ^ 1, cols)
            plain = plain and data[26:30] == struct.pack(">I", oid)
            mangle = rng.random()
            if mangle < 0.05:
                data = data[: rng.randrange(26, len(data))]
                plain = False
            elif mangle < 0.08:
                data += b"\x00"
                plain = False
            elif mangle < 0.1:
                data = data[:30] + b"K" + data[31:]  # not the new tuple
                plain = False
            took = _check(router, data)
            valid += plain
            taken += took and plain
    assert valid > 1000 and taken == valid, f"the compiled reader took {taken} of {valid} plain rows"


class _Bytes(bytes):
    pass


def test_a_message_of_a_bytes_subclass_reads_as_python_reads_it() -> None:
    """The reader takes any bytes (a subclass too), as the Python path does: both return plain bytes."""
    router = _router(FIELDS, 77)
    values = [b"id1", b"Order", b"o-1", b"OrderPlaced", b"2", b'{"x": 1}', b'{"h": "v"}']
    data = _insert(77, [("t", v) for v in values])
    assert _check(router, _Bytes(data)) and _check(router, data)


def _outcome(call: Any) -> Any:
    try:
        return ("fields", call())
    except CdcError as exc:
        return ("error", type(exc).__name__, str(exc))
    except Exception as exc:  # noqa: BLE001 - what each path raises is the comparison
        return ("raised", type(exc).__name__)


@pytest.mark.parametrize("version", [True, False])
@pytest.mark.parametrize("kind", [bytearray, memoryview, lambda d: memoryview(bytearray(d)), _Bytes])
def test_a_message_that_is_not_bytes_reads_as_python_reads_it(kind: Any, version: bool) -> None:
    """Issue 42, item 8b: a bytearray or memoryview is handed to the Python path (None), whose outcome the
    pipeline then takes: the same, byte for byte and error for error, as with no compiled reader at all."""
    names = FIELDS if version else [f for f in FIELDS if f != "schema_version"]
    router = _router(names, 78, **({} if version else {"schema_version": False}))
    values = [b"id1", b"Order", b"o-1", b"OrderPlaced", b"2", b'{"x": 1}', b'{"h": "v"}']
    data = _insert(78, [("t", v) for n, v in zip(FIELDS, values, strict=True) if n in names])
    message = kind(data)
    assert router.row_reader is not None

    def compiled() -> Any:  # what the pipeline does: the compiled reader, else the Python path
        assert router.row_reader is not None
        fields = router.row_reader(message)
        return fields if fields is not None else _python_fields(router, message)

    expected = _outcome(lambda: _python_fields(router, message))
    got = _outcome(compiled)
    assert got == expected
    if got[0] == "fields":
        assert [type(f) for f in got[1]] == [type(f) for f in expected[1]]


def _python_fields(router: EventRouter, data: Any) -> Any:
    oid, values = decode_insert_tuple(data, offset=25)
    assert oid == router.outbox_oid
    return router.row_fields(values)


@pytest.mark.parametrize("message", [None, 7, "w" * 40, [b"w"], b"", b"w", bytearray(b"w" * 40)])
def test_the_compiled_reader_never_raises_on_what_python_does_not_read_either(message: Any) -> None:
    router = _router(FIELDS, 79)
    assert router.row_reader is not None
    assert router.row_reader(message) is None
