"""The CLI without services: config show, redaction, exit codes of configuration errors."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from cdc.cli import main

PLANT = "s3cr3t-PLANT"


def run(args, env=None):
    # None unsets: the CDC_* variables of the shell (a sourced .stack/env) are not this test's.
    outside = {k: None for k in os.environ if k.startswith("CDC_")}
    base = {"CDC_DATABASE_URL": f"postgresql://app:{PLANT}@db.internal:5432/shop"}
    return CliRunner().invoke(main, args, env={**outside, **base, **(env or {})})


def test_config_show_redacts_and_names_the_sources(tmp_path):
    config = tmp_path / "cdc.toml"
    config.write_text(f'slot = "from_file"\n[kafka]\n"sasl.password" = "{PLANT}"\n')
    result = run(
        ["config", "show", "--config", str(config), "--publication", "from_flag"], {"CDC_TABLE": "app.events"}
    )
    assert result.exit_code == 0, result.output
    assert PLANT not in result.output
    lines = dict(line.split(" = ", 1) for line in result.output.splitlines())
    assert lines["slot"] == f'"from_file"  # in {config}'
    assert lines["publication"] == '"from_flag"  # from the overrides'
    assert lines["database_url"].startswith('"postgresql://app:***@db.internal:5432/shop"')
    assert lines["kafka.sasl.password"] == f'"***"  # in {config}'
    assert "sources" not in lines


def test_config_show_json_is_parseable_and_redacted():
    result = run(["config", "show", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["database_url"] == "postgresql://app:***@db.internal:5432/shop"
    assert data["slot"] == "cdc_outbox"


def test_configuration_error_exits_2_with_one_line_naming_the_key():
    result = run(["config", "show"], {"CDC_STATUS_INTERVAL": "soon"})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "cdc: error: setting 'status_interval' (from CDC_STATUS_INTERVAL) must be a number of seconds, "
        "got 'soon'"
    ]


def test_help_shows_no_secret_defaults():
    result = run(["run", "--help"])
    assert result.exit_code == 0
    assert PLANT not in result.output
    assert "--database-url" in result.output


def test_setup_dry_run_prints_the_sql_without_a_database():
    result = run(["setup", "--dry-run", "--slot", "s1"])
    assert result.exit_code == 0, result.output
    assert "pg_create_logical_replication_slot('s1', 'pgoutput')" in result.output
    assert "CREATE PUBLICATION" in result.output
