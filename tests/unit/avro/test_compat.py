"""Unit tests of cdc.avro.compat: Avro schema resolution rules, compatibility modes, violation messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from cdc.avro.compat import MODES, VersionGapError, Violation, check_pair, check_versions
from cdc.avro.resolution import Incompatibility, InvalidSchemaError, reader_can_read

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def rec(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def fld(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def one(type_: Any) -> dict[str, Any]:
    """A record with one field ``x`` of the given type, so that problems have the path ``x``."""
    return rec("R", fld("x", type_))


def enum(name: str, *symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": name, "symbols": list(symbols), **extra}


def fixed(name: str, size: int, **extra: Any) -> dict[str, Any]:
    return {"type": "fixed", "name": name, "size": size, **extra}


ADDRESS = rec("Address", fld("city", "string"))
ADDRESS_ZIP = rec("Address", fld("city", "string"), fld("zip", "string"))
ITEM = rec("Item", fld("sku", "string"), fld("quantity", "int"))
ITEM_STR = rec("Item", fld("sku", "string"), fld("quantity", "string"))
NODE = rec("Node", fld("value", "int"), fld("next", ["null", "Node"]))
NODE_LABEL_DEFAULT = rec(
    "Node", fld("value", "int"), fld("next", ["null", "Node"]), fld("label", "string", default="")
)
NODE_LABEL = rec("Node", fld("value", "int"), fld("next", ["null", "Node"]), fld("label", "string"))
NODE_LONG = rec("Node", fld("value", "string"), fld("next", ["null", "Node"]))
ORDER_V1 = orjson.loads((SCHEMAS / "OrderPlaced" / "v1.avsc").read_bytes())

PROMOTIONS = [
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
]
NOT_PROMOTIONS = [
    ("long", "int"),
    ("float", "int"),
    ("double", "int"),
    ("float", "long"),
    ("double", "long"),
    ("double", "float"),
    ("string", "int"),
    ("int", "string"),
    ("boolean", "int"),
    ("null", "string"),
]

# (id, reader, writer, expected [(rule, path), ...])
CASES: list[tuple[str, Any, Any, list[tuple[str, str]]]] = [
    ("identical", ORDER_V1, ORDER_V1, []),
    (
        "field-added-with-default",
        rec("R", fld("a", "int"), fld("b", "int", default=0)),
        rec("R", fld("a", "int")),
        [],
    ),
    (
        "field-added-null-default",
        rec("R", fld("a", "int"), fld("b", ["null", "int"], default=None)),
        rec("R", fld("a", "int")),
        [],
    ),
    (
        "field-added-no-default",
        rec("R", fld("a", "int"), fld("b", "int")),
        rec("R", fld("a", "int")),
        [("missing-default", "b")],
    ),
    ("writer-extra-field-ignored", rec("R", fld("a", "int")), rec("R", fld("a", "int"), fld("b", "int")), []),
    (
        "field-order-irrelevant",
        rec("R", fld("b", "int"), fld("a", "int")),
        rec("R", fld("a", "int"), fld("b", "int")),
        [],
    ),
    *[(f"promote-{w}-to-{r}", one(r), one(w), []) for w, r in PROMOTIONS],
    *[(f"no-promote-{w}-to-{r}", one(r), one(w), [("type-mismatch", "x")]) for w, r in NOT_PROMOTIONS],
    ("logical-type-ignored", one({"type": "long", "logicalType": "timestamp-millis"}), one("long"), []),
    ("record-vs-primitive-at-root", ADDRESS, "string", [("type-mismatch", "")]),
    ("union-narrowed-to-branch", one("string"), one(["null", "string"]), [("union-branch", "x")]),
    ("non-union-widened-to-union", one(["null", "string"]), one("string"), []),
    ("union-branch-promoted", one(["null", "long"]), one("int"), []),
    ("union-to-union-promoted", one(["null", "long"]), one(["null", "int"]), []),
    (
        "union-narrowed-to-union",
        one(["null", "string"]),
        one(["null", "string", "int"]),
        [("union-branch", "x")],
    ),
    ("no-union-branch-matches", one(["null", "string"]), one("int"), [("union-branch", "x")]),
    ("union-reorder", one(["string", "null"]), one(["null", "string"]), []),
    (
        "union-first-match-resolved-deeply",
        one(["null", ADDRESS_ZIP]),
        one(ADDRESS),
        [("missing-default", "x.zip")],
    ),
    ("enum-same", one(enum("S", "A", "B")), one(enum("S", "A", "B")), []),
    (
        "enum-writer-symbol-unknown",
        one(enum("S", "A")),
        one(enum("S", "A", "B", "C")),
        [("enum-symbol", "x")] * 2,
    ),
    (
        "enum-writer-symbol-unknown-reader-default",
        one(enum("S", "A", "U", default="U")),
        one(enum("S", "A", "B")),
        [],
    ),
    ("enum-reader-has-extra-symbol", one(enum("S", "A", "B")), one(enum("S", "A")), []),
    ("enum-renamed", one(enum("T", "A")), one(enum("S", "A")), [("name-mismatch", "x")]),
    ("enum-renamed-with-alias", one(enum("T", "A", aliases=["S"])), one(enum("S", "A")), []),
    ("record-renamed", rec("New", fld("a", "int")), rec("Old", fld("a", "int")), [("name-mismatch", "")]),
    (
        "record-renamed-with-alias",
        rec("New", fld("a", "int"), aliases=["Old"]),
        rec("Old", fld("a", "int")),
        [],
    ),
    (
        "record-renamed-with-qualified-alias",
        rec("New", fld("a", "int"), namespace="x", aliases=["z.Old"]),
        rec("Old", fld("a", "int"), namespace="z"),
        [],
    ),
    (
        # An alias names a full name: y.Old is not the writer's z.Old (Java agrees).
        "record-alias-qualified-with-another-namespace",
        rec("New", fld("a", "int"), namespace="x", aliases=["y.Old"]),
        rec("Old", fld("a", "int"), namespace="z"),
        [("name-mismatch", "")],
    ),
    (
        "writer-alias-does-not-count",
        rec("New", fld("a", "int")),
        rec("Old", fld("a", "int"), aliases=["New"]),
        [("name-mismatch", "")],
    ),
    (
        "namespace-ignored",
        rec("R", fld("a", "int"), namespace="a.b"),
        rec("R", fld("a", "int"), namespace="c"),
        [],
    ),
    (
        "nested-record-renamed",
        one(rec("PostalAddress", fld("city", "string"))),
        one(ADDRESS),
        [("name-mismatch", "x")],
    ),
    (
        "field-renamed-with-alias",
        rec("R", fld("amount_cents", "long", aliases=["amount"])),
        rec("R", fld("amount", "long")),
        [],
    ),
    (
        "field-renamed-without-alias",
        rec("R", fld("amount_cents", "long")),
        rec("R", fld("amount", "long")),
        [("missing-default", "amount_cents")],
    ),
    (
        "field-alias-resolved-recursively",
        rec("R", fld("total", "int", aliases=["amount"])),
        rec("R", fld("amount", "string")),
        [("type-mismatch", "total")],
    ),
    (
        "nested-type-change",
        rec("R", fld("address", rec("Address", fld("city", "int")))),
        rec("R", fld("address", ADDRESS)),
        [("type-mismatch", "address.city")],
    ),
    (
        "nested-missing-default",
        rec("R", fld("address", ADDRESS_ZIP)),
        rec("R", fld("address", ADDRESS)),
        [("missing-default", "address.zip")],
    ),
    (
        "array-of-records",
        rec("R", fld("items", {"type": "array", "items": ITEM_STR})),
        rec("R", fld("items", {"type": "array", "items": ITEM})),
        [("type-mismatch", "items[].quantity")],
    ),
    (
        "array-items-promoted",
        one({"type": "array", "items": "long"}),
        one({"type": "array", "items": "int"}),
        [],
    ),
    (
        "map-of-records",
        rec("R", fld("attrs", {"type": "map", "values": rec("V", fld("x", "long"))})),
        rec("R", fld("attrs", {"type": "map", "values": rec("V", fld("x", "double"))})),
        [("type-mismatch", "attrs{}.x")],
    ),
    (
        "array-vs-map",
        one({"type": "map", "values": "int"}),
        one({"type": "array", "items": "int"}),
        [("type-mismatch", "x")],
    ),
    ("fixed-same", one(fixed("H", 16)), one(fixed("H", 16)), []),
    ("fixed-size-changed", one(fixed("H", 32)), one(fixed("H", 16)), [("fixed-size", "x")]),
    ("fixed-renamed", one(fixed("G", 16)), one(fixed("H", 16)), [("name-mismatch", "x")]),
    ("fixed-renamed-with-alias", one(fixed("G", 16, aliases=["H"])), one(fixed("H", 16)), []),
    (
        "fixed-renamed-and-resized",
        one(fixed("G", 8)),
        one(fixed("H", 16)),
        [("name-mismatch", "x"), ("fixed-size", "x")],
    ),
    (
        "named-reference-reused",
        rec("R", fld("billing", ADDRESS_ZIP), fld("shipping", "Address")),
        rec("R", fld("billing", ADDRESS), fld("shipping", "Address")),
        [("missing-default", "billing.zip"), ("missing-default", "shipping.zip")],
    ),
    (
        "reference-by-fullname-and-short-name",
        rec("R", fld("a", rec("Address", fld("city", "string"))), fld("b", "Address"), namespace="ns"),
        rec("R", fld("a", rec("Address", fld("city", "string"), namespace="ns")), fld("b", "ns.Address")),
        [],
    ),
    ("recursive-identical", NODE, NODE, []),
    ("recursive-added-defaulted-field", NODE_LABEL_DEFAULT, NODE, []),
    ("recursive-added-field-no-default", NODE_LABEL, NODE, [("missing-default", "label")]),
    ("recursive-type-change", NODE_LONG, NODE, [("type-mismatch", "value")]),
]


@pytest.mark.parametrize(("reader", "writer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reader_can_read(reader: Any, writer: Any, expected: list[tuple[str, str]]) -> None:
    problems = reader_can_read(reader, writer)
    assert [(p.rule, p.path) for p in problems] == expected
    for p in problems:
        assert p.message.endswith(".") and p.message[0].isupper()


def test_incompatibility_details() -> None:
    [problem] = reader_can_read(one("int"), one("string"))
    assert problem == Incompatibility(
        "x", "type-mismatch", "The writer's string cannot be read as the reader's int.", "string", "int"
    )
    [symbol] = reader_can_read(one(enum("S", "A")), one(enum("S", "A", "PENDING")))
    assert (symbol.rule, symbol.writer) == ("enum-symbol", "PENDING")


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(one("Missing"), id="undefined-name"),
        pytest.param(rec("R", fld("a", "int"), fld("b", rec("R", fld("c", "int")))), id="defined-twice"),
        pytest.param({"type": "array"}, id="array-without-items"),
        pytest.param(42, id="not-a-schema"),
    ],
)
def test_invalid_schema(schema: Any) -> None:
    with pytest.raises(InvalidSchemaError):
        reader_can_read(schema, "int")


A = fld("a", "int")
PAIR_OLD = rec("R", A)
PAIR_NEW = rec("R", A, fld("b", "int"))  # backward-incompatible, forward-compatible


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("BACKWARD", [("missing-default", "b")]),
        ("BACKWARD_TRANSITIVE", [("missing-default", "b")]),
        ("FORWARD", []),
        ("FORWARD_TRANSITIVE", []),
        ("FULL", [("missing-default", "b")]),
        ("FULL_TRANSITIVE", [("missing-default", "b")]),
        ("NONE", []),
    ],
)
def test_check_pair_directions(mode: str, expected: list[tuple[str, str]]) -> None:
    assert [(p.rule, p.path) for p in check_pair(PAIR_NEW, PAIR_OLD, mode)] == expected
    # Swapping the versions swaps the directions.
    swapped = [(p.rule, p.path) for p in check_pair(PAIR_OLD, PAIR_NEW, mode)]
    assert swapped == ([] if mode.startswith("BACKWARD") or mode == "NONE" else [("missing-default", "b")])


def test_check_pair_full_reports_both_directions() -> None:
    problems = check_pair(one("long"), one("string"), "FULL")
    assert [(p.rule, p.writer, p.reader) for p in problems] == [
        ("type-mismatch", "string", "long"),
        ("type-mismatch", "long", "string"),
    ]


def test_none_accepts_anything() -> None:
    assert check_pair("string", ORDER_V1, "NONE") == []
    assert check_versions("E", {1: ORDER_V1, 2: "string", 3: {"type": "map", "values": "int"}}, "NONE") == []


@pytest.mark.parametrize("call", [check_pair, check_versions], ids=["check_pair", "check_versions"])
def test_unknown_mode(call: Any) -> None:
    args = ("E", {1: "int"}, "SIDEWAYS") if call is check_versions else ("int", "int", "SIDEWAYS")
    with pytest.raises(ValueError, match="SIDEWAYS.*BACKWARD, BACKWARD_TRANSITIVE, .*NONE"):
        call(*args)


# v3 reads v2 and v2 reads v1, but v3 cannot read v1: b was optional in v2 only.
HIST_BACK = {1: rec("R", A), 2: rec("R", A, fld("b", "int", default=0)), 3: rec("R", A, fld("b", "int"))}
# v1 reads v2 and v2 reads v3, but v1 cannot read v3: v1 needs b, which v3 dropped.
HIST_FWD = {1: rec("R", A, fld("b", "int")), 2: rec("R", A, fld("b", "int", default=0)), 3: rec("R", A)}
# int -> long -> int: each step fails in one direction.
HIST_TYPE = {1: one("int"), 2: one("long"), 3: one("int")}

MODE_CASES = [
    ("back", HIST_BACK, "BACKWARD", []),
    ("back", HIST_BACK, "BACKWARD_TRANSITIVE", [(3, 1, "backward", "missing-default", "b")]),
    ("back", HIST_BACK, "FORWARD", []),
    ("back", HIST_BACK, "FORWARD_TRANSITIVE", []),
    ("back", HIST_BACK, "FULL", []),
    ("back", HIST_BACK, "FULL_TRANSITIVE", [(3, 1, "backward", "missing-default", "b")]),
    ("back", HIST_BACK, "NONE", []),
    ("fwd", HIST_FWD, "BACKWARD", []),
    ("fwd", HIST_FWD, "BACKWARD_TRANSITIVE", []),
    ("fwd", HIST_FWD, "FORWARD", []),
    ("fwd", HIST_FWD, "FORWARD_TRANSITIVE", [(3, 1, "forward", "missing-default", "b")]),
    ("fwd", HIST_FWD, "FULL", []),
    ("fwd", HIST_FWD, "FULL_TRANSITIVE", [(3, 1, "forward", "missing-default", "b")]),
    ("type", HIST_TYPE, "BACKWARD", [(3, 2, "backward", "type-mismatch", "x")]),
    ("type", HIST_TYPE, "BACKWARD_TRANSITIVE", [(3, 2, "backward", "type-mismatch", "x")]),
    ("type", HIST_TYPE, "FORWARD", [(2, 1, "forward", "type-mismatch", "x")]),
    ("type", HIST_TYPE, "FORWARD_TRANSITIVE", [(2, 1, "forward", "type-mismatch", "x")]),
    (
        "type",
        HIST_TYPE,
        "FULL",
        [(2, 1, "forward", "type-mismatch", "x"), (3, 2, "backward", "type-mismatch", "x")],
    ),
    (
        "type",
        HIST_TYPE,
        "FULL_TRANSITIVE",
        [(2, 1, "forward", "type-mismatch", "x"), (3, 2, "backward", "type-mismatch", "x")],
    ),
    ("type", HIST_TYPE, "NONE", []),
]


@pytest.mark.parametrize(
    ("history", "mode", "expected"), [c[1:] for c in MODE_CASES], ids=[f"{c[0]}-{c[2]}" for c in MODE_CASES]
)
def test_check_versions_modes(history: dict[int, Any], mode: str, expected: list[tuple[Any, ...]]) -> None:
    violations = check_versions("E", history, mode)
    assert [
        (v.new_version, v.old_version, v.direction, v.problem.rule, v.problem.path) for v in violations
    ] == expected
    assert all(v.event_type == "E" for v in violations)


def test_every_mode_is_covered() -> None:
    assert {c[2] for c in MODE_CASES} == set(MODES)


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        pytest.param([1, 3], "OrderPlaced: versions must be contiguous from v1; v2 is missing", id="hole"),
        pytest.param([2, 3], "OrderPlaced: versions must be contiguous from v1; v1 is missing", id="no-v1"),
        pytest.param(
            [0, 1], "OrderPlaced: versions must be contiguous from v1; 0 is not a version number", id="v0"
        ),
    ],
)
def test_version_gap(versions: list[int], message: str) -> None:
    with pytest.raises(VersionGapError) as excinfo:
        check_versions("OrderPlaced", {v: ORDER_V1 for v in versions}, "BACKWARD")
    assert str(excinfo.value) == message
    assert isinstance(excinfo.value, ValueError)


@pytest.mark.parametrize(("schemas"), [pytest.param({}, id="none"), pytest.param({1: ORDER_V1}, id="single")])
def test_nothing_to_compare(schemas: dict[int, Any]) -> None:
    assert check_versions("OrderPlaced", schemas, "FULL_TRANSITIVE") == []


def order(*fields: dict[str, Any]) -> dict[str, Any]:
    return rec("OrderPlaced", fld("order_id", "string"), *fields, namespace="outbox.events")


STATUS = enum("Status", "PENDING", "PAID")
STATUS_PAID = enum("Status", "PAID")
ITEMS = fld("items", {"type": "array", "items": ITEM})
ITEMS_STR = fld("items", {"type": "array", "items": ITEM_STR})

MESSAGE_CASES = [
    (
        "removes-field-forward",
        [order(fld("amount", "long")), order(fld("amount", "long")), order()],
        "FORWARD",
        "OrderPlaced v3 removes field 'amount' that v2 readers need and gives no default",
    ),
    (
        "adds-field-backward",
        [order(), order(), order(fld("coupon", "string"))],
        "BACKWARD",
        "OrderPlaced v3 adds field 'coupon' without a default: v3 readers cannot read v2 data",
    ),
    (
        "changes-type-backward",
        [order(fld("amount", "string")), order(fld("amount", "int"))],
        "BACKWARD",
        "OrderPlaced v2 changes field 'amount' from string to int: v2 readers cannot read v1 data",
    ),
    (
        "changes-type-forward",
        [order(fld("amount", "int")), order(fld("amount", "long"))],
        "FORWARD",
        "OrderPlaced v2 changes field 'amount' from int to long: v1 readers cannot read v2 data",
    ),
    (
        "changes-nested-type",
        [order(ITEMS), order(ITEMS_STR)],
        "BACKWARD",
        "OrderPlaced v2 changes field 'items[].quantity' from int to string: v2 readers cannot read v1 data",
    ),
    (
        "removes-enum-symbol",
        [order(fld("status", STATUS)), order(fld("status", STATUS_PAID))],
        "BACKWARD",
        "OrderPlaced v2 removes enum symbol 'PENDING' from field 'status' and has no enum default: "
        "v2 readers cannot read v1 data",
    ),
    (
        "adds-enum-symbol",
        [order(fld("status", STATUS_PAID)), order(fld("status", STATUS))],
        "FORWARD",
        "OrderPlaced v2 adds enum symbol 'PENDING' to field 'status'; "
        "v1 readers lack it and have no enum default",
    ),
    (
        "fixed-size",
        [order(fld("h", fixed("H", 16))), order(fld("h", fixed("H", 32)))],
        "BACKWARD",
        "OrderPlaced v2 changes the size of fixed field 'h' from 16 to 32: v2 readers cannot read v1 data",
    ),
    (
        "renames-record",
        [order(), rec("OrderCreated", fld("order_id", "string"))],
        "BACKWARD",
        "OrderPlaced v2 renames the type of the top-level schema from 'OrderPlaced' to 'OrderCreated' "
        "with no alias 'OrderPlaced': v2 readers cannot read v1 data",
    ),
    (
        "narrows-union-backward",
        [order(fld("coupon", ["null", "string"], default=None)), order(fld("coupon", "string"))],
        "BACKWARD",
        "OrderPlaced v2 changes field 'coupon' to string, which cannot hold the null values of v1: "
        "v2 readers cannot read v1 data",
    ),
    (
        "widens-union-forward",
        [order(fld("coupon", "string")), order(fld("coupon", ["null", "string"], default=None))],
        "FORWARD",
        "OrderPlaced v2 lets field 'coupon' hold null values that v1 readers (string) cannot read",
    ),
]


@pytest.mark.parametrize(
    ("history", "mode", "expected"), [c[1:] for c in MESSAGE_CASES], ids=[c[0] for c in MESSAGE_CASES]
)
def test_violation_message(history: list[Any], mode: str, expected: str) -> None:
    versions = dict(enumerate(history, start=1))
    [violation] = check_versions("OrderPlaced", versions, mode)
    assert str(violation) == expected
    # Every message names the event type, both versions and the field.
    assert f"v{violation.new_version}" in expected and f"v{violation.old_version}" in expected
    assert violation.problem.path in expected


def test_violation_message_unknown_rule_falls_back_to_problem() -> None:
    problem = Incompatibility("x.y", "future-rule", "Something else is wrong.")
    text = str(Violation("E", 4, 2, "backward", problem))
    assert text == "E v4 is incompatible with v2 at field 'x.y' (future-rule): Something else is wrong."


def test_repository_schemas_are_backward_compatible() -> None:
    event_dirs = sorted(d for d in SCHEMAS.iterdir() if d.is_dir())
    assert event_dirs, "no schemas found"
    checked = 0
    for event_dir in event_dirs:
        schemas = {int(p.stem[1:]): orjson.loads(p.read_bytes()) for p in event_dir.glob("v*.avsc")}
        assert check_versions(event_dir.name, schemas, "BACKWARD") == [], event_dir.name
        checked += len(schemas)
    assert checked >= 4
