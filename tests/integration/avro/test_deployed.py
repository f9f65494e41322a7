"""`cdc schemas check --registry` against the stack's real schema registry (Apicurio, Confluent API): the
local versions the registry does not hold yet, checked against the ones it holds by us and by the registry."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cdc.cli import main

DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
MONEY = {"type": "record", "name": "Money", "fields": [{"name": "cents", "type": "long"}]}
V1 = {
    "type": "record",
    "name": "Shipment",
    "namespace": "acme",
    "fields": [{"name": "m", "type": MONEY}, {"name": "d", "type": DECIMAL}],
}


def with_field(index: int, **changes: Any) -> dict[str, Any]:
    schema = copy.deepcopy(V1)
    schema["fields"][index] = {**schema["fields"][index], **changes}
    return schema


class Deploy:
    """A schemas directory with its own topic in the stack's registry."""

    def __init__(self, root: Path, topic: str, url: str) -> None:
        self.root, self.topic, self.env = root, topic, {"CDC_SCHEMA_REGISTRY_URL": url}
        (root / "Shipment").mkdir(parents=True)

    def write(self, version: int, schema: Any) -> None:
        (self.root / "Shipment" / f"v{version}.avsc").write_text(json.dumps(schema))

    def cdc(self, command: str, *args: str, **env: str) -> Result:
        argv = ["schemas", command, "--schemas-dir", str(self.root), "--topic", self.topic, *args]
        return CliRunner().invoke(main, argv, env={**self.env, **env})

    def check(self, **env: str) -> Result:
        return self.cdc("check", "--registry", **env)

    @property
    def subject(self) -> str:
        return f"{self.topic}-acme.Shipment"


@pytest.fixture
def deploy(tmp_path: Path, schema_registry_url: str, unique_name) -> Deploy:
    d = Deploy(tmp_path / "schemas", unique_name("deployed"), schema_registry_url)
    d.write(1, V1)
    assert "nothing deployed yet" in d.check().output
    registered = d.cdc("register")
    assert registered.exit_code == 0, registered.output
    return d


def test_a_compatible_version_passes_both_checkers(deploy: Deploy) -> None:
    deploy.write(2, with_field(1, default="\u0000"))
    result = deploy.check()
    assert result.exit_code == 0, result.output
    assert (
        f"subject {deploy.subject!r}: 1 deployed version(s), BACKWARD; Shipment v1 = version 1"
        in result.output
    )
    assert f"ok: Shipment v2 under subject {deploy.subject!r} is BACKWARD compatible" in result.output
    assert result.output.rstrip().endswith("1 new version(s) agree with the registry")


@pytest.mark.parametrize(
    "v2",
    [
        {**V1, "fields": [*V1["fields"], {"name": "region", "type": "string"}]},
        # The namespace class of issue 18: a relative alias means other.Money, not the deployed acme.Money.
        with_field(0, type={**MONEY, "name": "Amount", "namespace": "other", "aliases": ["Money"]}),
    ],
    ids=["field-without-default", "moved-with-relative-alias"],
)
def test_a_version_the_registry_refuses_is_refused_by_both(deploy: Deploy, v2: Any) -> None:
    deploy.write(2, v2)
    result = deploy.check()
    assert result.exit_code == 1, result.output
    assert f"FAIL: Shipment v2 under subject {deploy.subject!r} is not BACKWARD compatible" in result.output
    assert "for both" in result.output and "DISAGREE" not in result.output
    refused = deploy.cdc("register")
    assert refused.exit_code != 0 and "refuses" in refused.output, refused.output  # the registry really does


def test_where_the_checkers_disagree_is_reported(deploy: Deploy) -> None:
    """A decimal's scale: the specification says the schemas no longer match, Java (so the registry) ignores
    logical types; ours follows the specification (docs/schema-checks.md)."""
    deploy.write(2, with_field(1, type={**DECIMAL, "scale": 3}))
    result = deploy.check()
    assert result.exit_code == 1, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("DISAGREE:"))
    assert f"Shipment v2 under subject {deploy.subject!r}" in line
    assert "we find it incompatible, the registry finds it compatible" in line and "decimal-mismatch" in line


def test_a_level_other_than_the_setting_and_a_foreign_version_are_named(deploy: Deploy) -> None:
    result = deploy.check(CDC_SCHEMA_COMPATIBILITY="FULL")
    assert result.exit_code == 1, result.output
    assert f"FAIL: subject {deploy.subject!r} has compatibility BACKWARD in the registry" in result.output
    # Someone registered a version that is no file here: consumers have it, and it is checked against.
    deploy.write(2, with_field(1, default="\u0001"))
    assert deploy.cdc("register").exit_code == 0
    deploy.write(2, with_field(1, default="\u0002"))
    result = deploy.check()
    assert "deployed version 2 matches none of the local Shipment files" in result.output
    assert "compatible with deployed version(s) 2, for both" in result.output, result.output
