"""The four ways `cdc schemas check` used to differ from Apache Avro's Java library (issue 18), one test each,
and the rules where the project departs from Java on purpose (docs/schema-checks.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc.avro.catalog import check_schemas
from cdc.avro.compat import check_pair
from cdc.avro.resolution import reader_can_read
from cdc.avro.validate import InvalidSchemaError, validate_schema
from cdc.cli import main


def event(*fields: dict[str, Any], namespace: str = "acme") -> dict[str, Any]:
    return {"type": "record", "name": "Event", "namespace": namespace, "fields": list(fields)}


def fld(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def write(root: Path, *versions: Any, event_type: str = "Event") -> Path:
    (root / event_type).mkdir(parents=True, exist_ok=True)
    for n, schema in enumerate(versions, 1):
        (root / event_type / f"v{n}.avsc").write_text(json.dumps(schema))
    return root


def check(root: Path, mode: str = "BACKWARD") -> Any:
    return CliRunner().invoke(main, ["schemas", "check", "--schemas-dir", str(root), "--mode", mode], env={})


# -- 1. aliases resolved by namespace (the dangerous side: these passed and Java calls them incompatible) --

STATUS = {"type": "enum", "name": "Status", "symbols": ["A", "B"]}
MONEY = {"type": "record", "name": "Money", "fields": [fld("cents", "long")]}


@pytest.mark.parametrize(
    ("old_type", "new_type", "compatible"),
    [
        # moved to another namespace with a relative alias: the alias means other.Money, not acme.Money
        (MONEY, {**MONEY, "name": "Amount", "namespace": "other", "aliases": ["Money"]}, False),
        (MONEY, {**MONEY, "name": "Amount", "namespace": "other", "aliases": ["acme.Money"]}, True),
        # an alias qualified with another namespace
        (MONEY, {**MONEY, "name": "Amount", "aliases": ["other.Money"]}, False),
        (MONEY, {**MONEY, "name": "Amount", "aliases": ["Money"]}, True),
        (STATUS, {**STATUS, "name": "State", "namespace": "other", "aliases": ["Status"]}, False),
        (STATUS, {**STATUS, "name": "State", "aliases": ["other.Status"]}, False),
        (STATUS, {**STATUS, "name": "State", "namespace": "other", "aliases": ["acme.Status"]}, True),
        # the same unqualified name in another namespace is the same type (names compare unqualified)
        (MONEY, {**MONEY, "namespace": "other"}, True),
    ],
    ids=[
        "record-moved-relative-alias",
        "record-moved-full-alias",
        "record-alias-of-another-namespace",
        "record-relative-alias",
        "enum-moved-relative-alias",
        "enum-alias-of-another-namespace",
        "enum-moved-full-alias",
        "record-moved-same-name",
    ],
)
def test_a_type_alias_is_resolved_against_its_namespace(
    tmp_path: Path, old_type: dict[str, Any], new_type: dict[str, Any], compatible: bool
) -> None:
    root = write(tmp_path, event(fld("x", old_type)), event(fld("x", new_type)))
    result = check(root)
    assert (result.exit_code == 0) is compatible, result.output
    if not compatible:
        assert "Event v2 renames the type of field 'x'" in result.output


@pytest.mark.parametrize(
    ("aliases", "rule"),
    [(["total"], None), (["total", "count"], "ambiguous-alias"), (["acme.total"], "missing-default")],
    ids=["one-alias", "two-writer-fields", "dotted-alias-is-no-field-name"],
)
def test_a_field_alias_is_a_plain_name_that_must_find_one_writer_field(
    aliases: list[str], rule: str | None
) -> None:
    writer = event(fld("total", "long"), fld("count", "int"))
    reader = event(fld("amount", "long", aliases=aliases), fld("count", "int"))
    assert [p.rule for p in reader_can_read(reader, writer)] == ([rule] if rule else [])


# -- 2. schemas that are not valid Avro are refused, with the file, the JSON path and the rule --------------


@pytest.mark.parametrize(
    ("schema", "path", "rule"),
    [
        (event(fld("1abc", "int")), "fields[0].name", "name"),
        (event(fld("a-b", "int")), "fields[0].name", "name"),
        (event(fld("x", {**MONEY, "name": "Bad-Name"})), "fields[0].type.name", "name"),
        (event(fld("x", "int"), fld("x", "long")), "fields[1].name", "duplicate-field"),
        (event(fld("u", ["int", "int"])), "fields[0].type[1]", "union-duplicate"),
        (
            event(fld("u", [{"type": "array", "items": "int"}, {"type": "array", "items": "string"}])),
            "fields[0].type[1]",
            "union-duplicate",
        ),
        (event(fld("f", {"type": "fixed", "name": "F", "size": "16"})), "fields[0].type.size", "fixed-size"),
        (event(fld("x", {"type": "record", "name": "Inner"})), "fields[0].type.fields", "missing-attribute"),
    ],
    ids=[
        "digit-first",
        "dash",
        "record-name",
        "two-fields",
        "two-ints",
        "two-arrays",
        "size-string",
        "no-fields",
    ],
)
def test_a_schema_java_cannot_parse_is_refused_with_file_path_and_rule(
    tmp_path: Path, schema: dict[str, Any], path: str, rule: str
) -> None:
    good = event(fld("ok", "int"))
    root = write(tmp_path, good, schema)
    result = check(root)
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("FAIL:")]
    assert "Event v2" in line and str(root / "Event" / "v2.avsc") in line, line
    assert f"at {path}:" in line and f"(rule: {rule})" in line, line
    with pytest.raises(InvalidSchemaError) as info:
        validate_schema(schema)
    assert (info.value.path, info.value.rule) == (path, rule)


def test_an_invalid_decimal_is_its_underlying_type(tmp_path: Path) -> None:
    """The spec: "if a logical type is invalid, for example a decimal with scale greater than its precision,
    then implementations should ignore the logical type and use the underlying Avro type" (Java does)."""
    bad_decimal = {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 3}
    root = write(tmp_path, event(fld("d", "bytes")), event(fld("d", bad_decimal)))
    result = check(root, "FULL")
    assert result.exit_code == 0, result.output
    assert "logicalType" not in validate_schema(bad_decimal)
    valid = {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 3}
    assert validate_schema(valid) == valid


# -- 3. every problem line names the event type, the version and the file -----------------------------


def test_every_problem_line_names_event_type_version_and_file(tmp_path: Path) -> None:
    nested_without_fields = event(fld("ok", "int"), fld("inner", {"type": "record", "name": "Inner"}))
    root = write(tmp_path, event(fld("ok", "int")), nested_without_fields)
    other = [{**event(fld("ok", t)), "name": "Other"} for t in ("int", "string")]
    write(root, *other, event_type="Other")
    report = check_schemas(root, "BACKWARD")
    assert len(report.problems) == 2, report.problems
    for problem in report.problems:
        assert problem.startswith(("schema for Event v2 in ", "Other v2 ")), problem
    invalid = next(p for p in report.problems if "Event" in p)
    assert str(root / "Event" / "v2.avsc") in invalid and "'fields'" in invalid


# -- 4. where the project departs from Java on purpose (docs/schema-checks.md) --------------------------

DEC = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
FIXED_DEC = {"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 10, "scale": 2}


@pytest.mark.parametrize(
    ("old", "new", "plain"),
    [
        (DEC, {**DEC, "scale": 3}, "bytes"),
        (DEC, {**DEC, "precision": 12}, "bytes"),
        (FIXED_DEC, {**FIXED_DEC, "scale": 4}, {"type": "fixed", "name": "D", "size": 8}),
    ],
    ids=["scale", "precision", "fixed"],
)
def test_decimals_match_only_with_equal_precision_and_scale(old: Any, new: Any, plain: Any) -> None:
    """The spec: "two schemas that are decimal logical types match if their scales and precisions match";
    Java's check ignores logical types. A scale read as another scale is another number: we refuse."""
    problems = check_pair(event(fld("d", new)), event(fld("d", old)), "FULL")
    assert [p.rule for p in problems] == ["decimal-mismatch", "decimal-mismatch"]
    assert check_pair(event(fld("d", old)), event(fld("d", old)), "FULL") == []
    assert check_pair(event(fld("d", plain)), event(fld("d", old)), "FULL") == [], "a decimal and its bytes"


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        (event(fld("café", "int")), "name"),
        (event(fld("x", "double", default="NaN")), "default"),
        (event(fld("x", "float", default="1.5")), "default"),
        (event(fld("x", {"type": "enum", "name": "E", "symbols": ["A"]}, default="B")), "default"),
        (event(fld("x", {"type": "fixed", "name": "F", "size": 2}, default="abc")), "default"),
        (event(fld("x", "bytes", default="\u0100")), "default"),
        (event(fld("early", "F"), fld("late", {"type": "fixed", "name": "F", "size": 2})), "undefined-name"),
        (
            event(
                fld("a", {"type": "fixed", "name": "F", "size": 2}),
                fld("b", {"type": "fixed", "name": "F", "size": 2}),
            ),
            "defined-once",
        ),
        (
            event(fld("f", {"type": "fixed", "name": "F", "size": 2, "namespace": ""}), fld("g", "F")),
            "undefined-name",
        ),
    ],
    ids=[
        "non-ascii-name",
        "nan-string-default",
        "number-string-default",
        "enum-default-not-a-symbol",
        "fixed-default-length",
        "bytes-default-code-point",
        "defined-before-use",
        "defined-twice",
        "null-namespace-reference",
    ],
)
def test_what_java_takes_and_the_specification_does_not_is_refused(schema: Any, rule: str) -> None:
    with pytest.raises(InvalidSchemaError) as info:
        validate_schema(schema)
    assert info.value.rule == rule


@pytest.mark.parametrize(
    "schema",
    [
        event(fld("u", ["null", "int"], default=5)),  # a later branch: the spec since 1.12 (AVRO-3649), Java
        event(fld("r", {**MONEY, "name": "M"}, default={"cents": 1, "note": "ignored"})),  # extra keys
        event(fld("x", "int", aliases=["a-b", "1x"])),  # a field alias may be any string
    ],
    ids=["union-default-later-branch", "record-default-extra-key", "field-alias-any-string"],
)
def test_what_both_take_is_taken(schema: Any) -> None:
    validate_schema(schema)


def test_a_type_alias_must_end_in_a_name_as_java_demands() -> None:
    with pytest.raises(InvalidSchemaError) as info:
        validate_schema(event(fld("m", {**MONEY, "aliases": ["a-b"]})))
    assert (info.value.path, info.value.rule) == ("fields[0].type.aliases[0]", "alias")


# -- one validation for check, run and register ---------------------------------------------------------


class _NoRegistry:
    strategy = "topic_record"

    def register_all(self, topic: str, event_type: str) -> Any:
        raise AssertionError("a schema reached the registry")


def test_register_refuses_before_anything_reaches_the_registry(tmp_path: Path) -> None:
    from cdc.avro.catalog import register_schemas
    from cdc.config_loader import load_settings
    from cdc.errors import ConfigError

    root = write(
        tmp_path, event(fld("ok", "int")), event(fld("ok", "int"), fld("u", ["int", "int"], default=1))
    )
    settings = load_settings(
        config_file=None, environ={}, overrides={"schemas_dir": str(root)}, require_database=False
    )
    with pytest.raises(ConfigError) as info:
        register_schemas(settings, aggregate_types=["order"], topics=[], registry=_NoRegistry())  # type: ignore[arg-type]
    assert "nothing was registered" in str(info.value)
    assert str(root / "Event" / "v2.avsc") in str(info.value) and "(rule: union-duplicate)" in str(info.value)
