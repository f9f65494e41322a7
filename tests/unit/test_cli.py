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
    lines = dict(line.split(" = ", 1) for line in result.output.splitlines() if not line.startswith("#"))
    assert lines["slot"] == f'"from_file"  # in {config}'
    assert lines["publication"] == '"from_flag"  # from the overrides'
    assert lines["database_url"].startswith('"postgresql://app:***@db.internal:5432/shop"')
    assert lines['kafka."sasl.password"'] == f'"***"  # in {config}'
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


def test_config_show_reads_back_as_the_same_settings(tmp_path):
    """`cdc config show` is TOML: pasted into a file, it loads as the settings it shows (secrets as ***)."""
    import tomllib

    from cdc.config_loader import load_settings

    config = tmp_path / "cdc.toml"
    config.write_text(
        'columns = { preset = "debezium", created_at = "created_at" }\n'
        'aggregate_types = ["order", "invoice"]\n'
        'schemas_dir = "schémas/ünï \\"quoted\\" 😀"\n'
        "[kafka]\n"
        '"security.protocol" = "SASL_SSL"\n'
        '"sasl.mechanism" = "SCRAM-SHA-512"\n'
        '"sasl.username" = "cdc"\n'
        '"sasl.password" = "s3cr3t"\n'
        '"socket.timeout.ms" = "30000"\n'
    )
    env = {
        "CDC_DATABASE_URL": "postgresql://cdc:pw@db:5432/app?sslmode=verify-full",
        "CDC_TRANSACTION_MAX_SECONDS": "0.25",
        "CDC_MAX_DEAD_LETTERS": "100",
        "CDC_CREATE_TOPICS": "false",
    }
    shown = run(["config", "show", "--config", str(config), "--log-level", "critical"], env)
    assert shown.exit_code == 0, shown.output
    data = tomllib.loads(shown.output)  # valid TOML
    again = tmp_path / "again.toml"
    again.write_text(shown.output)
    before = load_settings(config_file=config, environ=env, overrides={"log_level": "critical"}).redacted()
    after = load_settings(config_file=again, environ={}, overrides={}).redacted()
    before.pop("sources"), after.pop("sources")
    assert after == before
    assert data["kafka"]["security.protocol"] == "SASL_SSL" and data["kafka"]["sasl.password"] == "***"
    assert "s3cr3t" not in shown.output and ":pw@" not in shown.output


def test_log_level_critical_is_a_choice_as_the_setting_is():
    done = run(["config", "show", "--log-level", "CRITICAL"])
    assert done.exit_code == 0, done.output
    assert 'log_level = "CRITICAL"' in done.output
