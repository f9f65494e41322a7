from __future__ import annotations

import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from cdc.cli import main
from cdc.config import TableRef
from cdc.config_loader import load_settings
from cdc.errors import ConfigError
from cdc.ops.setup import render
from cdc.stream.source import pgoutput_options


def settings(**overrides):
    return load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides=overrides
    )


def test_scripts_are_rendered_in_order_with_quoted_names():
    steps = render(settings(table="app.outbox_events", publication="pub_x", slot="my_slot"))
    assert [s.name for s in steps] == [
        "01_outbox_table.sql",
        "02_publication.sql",
        "03_slot.sql",
        "04_outbox_emit.sql",
        "05_heartbeat.sql",
        "06_checkpoint.sql",
    ]
    sql = "".join(s.sql for s in steps)
    assert 'CREATE TABLE IF NOT EXISTS "app"."outbox_events"' in sql
    assert "pubname = 'pub_x'" in sql and 'CREATE PUBLICATION "pub_x"' in sql
    assert "pg_create_logical_replication_slot('my_slot', 'pgoutput')" in sql
    assert not re.search(r"\{\{\w+\}\}", sql), "every marker is filled in"


def test_debezium_preset_leaves_out_the_columns_it_does_not_have():
    table_sql = render(settings(columns="debezium"))[0].sql
    assert '"aggregatetype"' in table_sql and '"type"' in table_sql
    for absent in ("schema_version", "headers", "created_at"):
        assert f'"{absent}"' not in table_sql


def test_pgoutput_options_follow_the_server_version():
    assert pgoutput_options(170002, "p")["proto_version"] == "4"
    assert pgoutput_options(150018, "p") == {
        "proto_version": "3",
        "publication_names": '"p"',
        "messages": "true",
    }
    assert pgoutput_options(140000, "p")["proto_version"] == "2"
    assert pgoutput_options(130000, 'we"ird') == {"proto_version": "1", "publication_names": '"we""ird"'}


def test_failover_slot_arguments_only_when_asked():
    plain = next(s.sql for s in render(settings()) if s.name == "03_slot.sql")
    failover = next(s.sql for s in render(settings(), failover=True) if s.name == "03_slot.sql")
    assert "pg_create_logical_replication_slot('cdc_outbox', 'pgoutput')" in plain
    assert "pg_create_logical_replication_slot('cdc_outbox', 'pgoutput', false, false, true)" in failover


def test_role_script_only_with_a_role():
    assert "07_role.sql" not in [s.name for s in render(settings())]
    role_sql = next(s.sql for s in render(settings(), role="cdc_stream") if s.name == "07_role.sql")
    assert 'CREATE ROLE "cdc_stream" LOGIN NOSUPERUSER' in role_sql
    # REPLICATION, or on Amazon RDS (no attribute to give) membership in rds_replication.
    assert 'ALTER ROLE "cdc_stream" REPLICATION' in role_sql
    assert 'GRANT rds_replication TO "cdc_stream"' in role_sql
    assert 'GRANT SELECT, INSERT, UPDATE ON "public"."cdc_heartbeat" TO "cdc_stream"' in role_sql


@pytest.mark.parametrize(
    "role", ["cdc$$; DROP TABLE x; --", "a$b", 'we"ird', "it's", "a b", "1st", "", "r" * 64]
)
def test_a_role_that_is_not_a_plain_identifier_is_refused_naming_the_flag(role):
    with pytest.raises(ConfigError, match=r"^--role .* use letters, digits and _") as info:
        render(settings(), role=role)
    assert info.value.key == "role"
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("option", ["table", "publication"])
def test_a_dollar_sign_in_a_name_is_refused_by_the_settings(option):
    with pytest.raises(ConfigError, match=option) as info:
        settings(**{option: "out$$box"})
    assert info.value.key == option


def test_a_dollar_sign_in_a_column_name_is_refused_by_the_settings():
    with pytest.raises(ConfigError, match=r"columns\.payload"):
        settings(columns={"payload": "pay$$load"})


@pytest.mark.parametrize(
    ("key", "changes"),
    [
        ("publication", {"publication": "p$$; DROP TABLE t; $$"}),
        ("table", {"table": TableRef(name="out$x")}),
        ("columns.payload", {"columns": replace(settings().columns, payload="pay$$load")}),
    ],
)
def test_render_refuses_a_name_with_a_dollar_sign_that_bypassed_the_settings(key, changes):
    # Settings built in code skip load_settings' checks; a `$$` in a name would end the DO body early.
    pattern = rf"^setting '{re.escape(key)}' .* has a '\$'.*without '\$'$"
    with pytest.raises(ConfigError, match=pattern) as info:
        render(replace(settings(), **changes))
    assert info.value.key == key


def test_dollar_quoted_bodies_hold_no_dollar_sign_but_their_delimiters():
    for step in render(settings(table="app.outbox_events", publication="pub_x"), role="cdc_stream"):
        assert step.sql.count("$") == 2 * step.sql.count("$$"), step.name


def test_cdc_setup_refuses_a_bad_role_in_one_line_before_connecting():
    # The DSN points nowhere: the refusal must come before any connection, with --dry-run or without.
    env = {"CDC_DATABASE_URL": "postgresql://u@127.0.0.1:1/db", "CDC_CONFIG": ""}
    for extra in (["--dry-run"], []):
        result = CliRunner().invoke(main, ["setup", "--role", "cdc$$x", *extra], env=env)
        assert result.exit_code == 2, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("cdc: error:")]
        assert errors == [
            "cdc: error: --role 'cdc$$x' is not a plain role name: use letters, digits and _ (starting with a"
            " letter or _, at most 63 characters), e.g. --role cdc_stream"
        ]
        assert "Traceback" not in result.output and "-- 01_outbox_table.sql" not in result.output


def test_the_role_option_lists_every_grant_of_07_role_sql():
    """`cdc setup --help` says what the role gets: every GRANT of 07_role.sql, and its attributes."""
    from cdc.ops.setup import SCRIPTS_DIR
    from cdc.stream.heartbeat import HEARTBEAT_TABLE
    from cdc.stream.progress import CHECKPOINT_TABLE

    (option,) = [p for p in main.commands["setup"].params if p.name == "role"]
    help_text = option.help or ""
    objects = {
        "{{schema}}": "the outbox's schema",
        "{{table}}": "the outbox table",
        "{{heartbeat_table}}": HEARTBEAT_TABLE,
        "{{checkpoint_table}}": CHECKPOINT_TABLE,
    }
    script = (SCRIPTS_DIR / "07_role.sql").read_text()
    grants = re.findall(r"^GRANT (.+?) ON (?:SCHEMA )?(\{\{\w+\}\}) TO", script, re.M)
    assert len(grants) == 4, grants
    for privileges, target in grants:
        assert target in objects, f"07_role.sql grants on {target}: name it in --role's help"
        assert f"{privileges} on {objects[target]}" in help_text, (privileges, target, help_text)
    for attribute in re.findall(r"(?:CREATE|ALTER) ROLE \{\{role\}\} ([A-Z ]+);", script):
        for word in attribute.split():
            if not word.startswith("NO"):  # what it is refused is not a grant
                assert word in help_text, (word, help_text)
    assert "GRANT rds_replication" in script and "rds_replication" in help_text


def test_the_scripts_name_only_files_that_exist():
    """A path a script's comments give (the test that found its grants, a module) is there to be read."""
    from pathlib import Path

    from cdc.ops.setup import SCRIPTS_DIR

    root = Path(__file__).resolve().parents[3]
    named = {
        (script.name, path)
        for script in SCRIPTS_DIR.glob("*.sql")
        for path in re.findall(r"\b((?:tests|cdc|docs)/[\w/.-]+\.(?:py|md|sql))", script.read_text())
    }
    assert named, "the scripts name no file: is the pattern still right?"
    missing = [(script, path) for script, path in named if not (root / path).is_file()]
    assert not missing, missing
