"""The Helm chart's values.schema.json knows every setting of `cdc run` by name and type, so that a misspelt
or mistyped one is refused by `helm install` (tests/deploy/test_chart.py shows helm refusing them); a
setting added to cdc.config.Settings must be added there too, or this fails."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from cdc.config import _CHOICES, _MIN_SECONDS, _SECRET_KEY_PARTS, PRESETS, Settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "deploy/helm/outbox-cdc/values.schema.json").read_text())
# The settings the chart sets itself (from the pipeline's entry, the metrics port, the mounted files).
CHART_OWNS = {
    *("database_url", "database_password_file", "kafka_sasl_password_file", "slot", "publication", "table"),
    *("topic_template", "dlq_topic", "delivery", "on_slot_active", "metrics_port", "metrics_host"),
    *("schema_registry_url", "schema_registry_ca_file", "kafka", "sources"),
}


def settings_schema() -> dict[str, Any]:
    properties: dict[str, Any] = SCHEMA["definitions"]["settings"]["properties"]
    return properties


def test_every_setting_is_known_to_the_schema_and_none_of_the_charts_own() -> None:
    assert set(settings_schema()) == {f.name for f in fields(Settings)} - CHART_OWNS
    assert SCHEMA["definitions"]["settings"]["additionalProperties"] is False


def test_each_setting_has_its_type() -> None:
    schema = settings_schema()
    for f in fields(Settings):
        if f.name in CHART_OWNS:
            continue
        kind, rule = str(f.type), schema[f.name]
        if f.name in _CHOICES:
            assert set(_CHOICES[f.name]) <= set(rule["enum"]), f.name
        elif f.name == "columns":
            assert rule["enum"] == list(PRESETS)
        elif kind.startswith("float"):
            assert rule["type"] == "number", f.name
            assert rule.get("minimum", 0) == _MIN_SECONDS.get(f.name, rule.get("minimum", 0)), f.name
        elif kind.startswith("int"):
            assert rule == {"type": "integer", "minimum": 1}, f.name
        elif kind == "bool":
            assert rule == {"type": "boolean"}, f.name
        elif kind.startswith("tuple"):
            assert rule["type"] == "array", f.name
        else:
            assert rule["type"] == "string", f.name


def test_no_secret_key_may_go_into_the_kafka_config() -> None:
    forbidden = re.compile(
        SCHEMA["definitions"]["kafka"]["properties"]["config"]["propertyNames"]["not"]["pattern"]
    )
    for part in _SECRET_KEY_PARTS:
        assert forbidden.search(f"x.{part}"), part
    assert not forbidden.search("socket.timeout.ms")
