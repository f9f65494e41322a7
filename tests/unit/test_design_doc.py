"""docs/design.md is the contract: its settings table must name every setting of cdc.config.Settings, with
the environment variable that sets it and its default."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from cdc.config import PRESETS, ColumnMap, KafkaSettings, Settings, TableRef
from cdc.config_loader import _ENV

DOC = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def documented() -> dict[str, tuple[str, str]]:
    """key -> (env, default) of each row of the settings table."""
    rows = re.findall(r"^\| `([a-z_.<> ]+)` \| `?([A-Z_<>]+|—)`? \| `?([^|`]*)`? \|", DOC.read_text(), re.M)
    return {key: (env, default.strip()) for key, env, default in rows}


def shown(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, ColumnMap):
        return next(name for name, preset in PRESETS.items() if preset == value)
    if isinstance(value, TableRef | Path):
        return str(value)
    return str(value)


def test_every_setting_is_in_the_design_table_with_its_variable_and_default():
    table = documented()
    env_of = {key: env for env, key in _ENV.items()}
    for f in fields(Settings):
        if f.name in ("kafka", "sources"):
            continue
        assert f.name in table, f"setting {f.name!r} is missing from docs/design.md"
        env, default = table[f.name]
        assert env == env_of[f.name], f"{f.name}: docs say {env}, the code reads {env_of[f.name]}"
        if f.default is not MISSING:
            want = shown(f.default)
        elif f.default_factory is not MISSING:
            want = shown(f.default_factory())
        else:
            want = "(required)"
        assert default == want, f"{f.name}: docs say default {default!r}, the code has {want!r}"
    assert table["kafka.bootstrap_servers"] == (
        "CDC_KAFKA_BOOTSTRAP_SERVERS",
        KafkaSettings().bootstrap_servers,
    )


def test_the_design_table_names_no_setting_that_does_not_exist():
    names = {f.name for f in fields(Settings)} | {"kafka.bootstrap_servers", "kafka.<librdkafka key>"}
    assert set(documented()) <= names
