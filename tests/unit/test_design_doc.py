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


def test_the_default_transactional_id_is_described_as_it_is_made():
    """config.py's comment and design.md's row say what cdc.stream.transactions makes when unset."""
    from cdc.stream.transactions import transactional_id

    settings = Settings(database_url="dbname=app", slot="orders")
    assert transactional_id(settings, "7301") == "outbox-cdc.7301.orders"
    said = "outbox-cdc.<system identifier>.<slot>"
    assert said in DOC.read_text()
    source = (Path(__file__).resolve().parents[2] / "cdc" / "config.py").read_text()
    comment = source.split("    transactional_id: str | None = None", 1)[0].rsplit("\n", 2)[-2]
    assert "outbox-cdc.<PostgreSQL's system identifier>.<slot>" in comment, comment
