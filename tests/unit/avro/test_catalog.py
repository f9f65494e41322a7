"""`cdc schemas list|check` over a schemas directory: the deploy gate (the rules are in test_compat.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc.avro.catalog import check_schemas, list_schemas
from cdc.cli import main

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


@pytest.fixture
def schemas(tmp_path: Path) -> Path:
    root = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, root)
    return root


def order_placed(version: int, schemas: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((schemas / "OrderPlaced" / f"v{version}.avsc").read_text())
    return data


def write(schemas: Path, event_type: str, version: int, schema: Any) -> None:
    (schemas / event_type).mkdir(exist_ok=True)
    (schemas / event_type / f"v{version}.avsc").write_text(json.dumps(schema))


def check(schemas: Path, *args: str) -> Any:
    # No CDC_DATABASE_URL: checking schemas must not need a database.
    return CliRunner().invoke(main, ["schemas", "check", "--schemas-dir", str(schemas), *args], env={})


def test_the_shipped_schemas_pass_and_are_listed() -> None:
    result = check(SCHEMAS)
    assert result.exit_code == 0, result.output
    assert "OrderPlaced: v1, v2" in result.output
    assert result.output.strip().endswith("BACKWARD")
    infos = {(i.event_type, i.version): i for i in list_schemas(SCHEMAS)}
    assert infos[("OrderPlaced", 2)].name == "outbox.events.OrderPlaced"
    assert len(infos[("OrderPlaced", 2)].fingerprint) == 16


def test_a_removed_field_without_default_fails_the_gate_with_a_precise_message(schemas: Path) -> None:
    v3 = order_placed(2, schemas)
    v3["fields"] = [f for f in v3["fields"] if f["name"] != "amount_cents"]
    write(schemas, "OrderPlaced", 3, v3)
    assert check(schemas).exit_code == 0  # BACKWARD: v3 readers simply ignore amount_cents
    result = check(schemas, "--mode", "forward")
    assert result.exit_code == 1
    assert (
        "FAIL: OrderPlaced v3 removes field 'amount_cents' that v2 readers need and gives no default"
        in result.output
    )
    assert "cdc: error: 1 schema problem(s)" in result.output


def test_mode_comes_from_the_setting(schemas: Path) -> None:
    v3 = order_placed(2, schemas)
    v3["fields"].append({"name": "region", "type": "string"})
    write(schemas, "OrderPlaced", 3, v3)
    result = CliRunner().invoke(
        main, ["schemas", "check", "--schemas-dir", str(schemas)], env={"CDC_SCHEMA_COMPATIBILITY": "none"}
    )
    assert result.exit_code == 0, result.output
    result = check(schemas)
    assert result.exit_code == 1
    assert (
        "OrderPlaced v3 adds field 'region' without a default: v3 readers cannot read v2 data"
        in result.output
    )


def test_transitive_mode_checks_every_earlier_version(schemas: Path) -> None:
    v1 = order_placed(1, schemas)
    v2 = order_placed(2, schemas)
    v3 = order_placed(2, schemas)
    v3["fields"][-1] = {"name": "coupon", "type": "string", "default": ""}  # v2 data has a union here
    v2["fields"][-1] = {"name": "coupon", "type": "string", "default": ""}
    write(schemas, "OrderPlaced", 2, v2)
    write(schemas, "OrderPlaced", 3, v3)
    v3["fields"].append({"name": "note", "type": "string", "default": ""})
    write(schemas, "OrderPlaced", 3, v3)
    assert v1 != v2
    assert check(schemas, "--mode", "BACKWARD_TRANSITIVE").exit_code == 0
    v3["fields"][-2] = {"name": "coupon", "type": "string"}  # no default: v1 data has no coupon
    write(schemas, "OrderPlaced", 3, v3)
    assert check(schemas, "--mode", "BACKWARD").exit_code == 0  # v2 data has a coupon
    result = check(schemas, "--mode", "BACKWARD_TRANSITIVE")
    assert result.exit_code == 1
    assert (
        "OrderPlaced v3 adds field 'coupon' without a default: v3 readers cannot read v1 data"
        in result.output
    )


def test_gaps_misnamed_and_broken_files_are_all_reported(schemas: Path) -> None:
    write(schemas, "OrderShipped", 3, order_placed(1, schemas))
    (schemas / "OrderPlaced" / "v02.avsc").write_text("{}")
    write(schemas, "Broken", 1, {"type": "record", "name": "NotBroken", "fields": []})
    report = check_schemas(schemas, "BACKWARD")
    assert not report.ok
    text = "\n".join(report.problems)
    assert "OrderPlaced/v02.avsc is not named v<N>.avsc" in text
    assert "must be a record named 'Broken'" in text
    assert "OrderShipped" in text and "v2 is missing" in text
    assert len(report.problems) == 4, report.problems  # + OrderShipped v3 is named OrderPlaced
