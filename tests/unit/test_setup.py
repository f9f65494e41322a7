from __future__ import annotations

import re

from cdc.config import load_settings
from cdc.setup import render
from cdc.source import pgoutput_options


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
    assert "06_role.sql" not in [s.name for s in render(settings())]
    role_sql = next(s.sql for s in render(settings(), role="cdc_stream") if s.name == "06_role.sql")
    assert 'CREATE ROLE "cdc_stream" LOGIN REPLICATION NOSUPERUSER' in role_sql
    assert 'GRANT SELECT, INSERT, UPDATE ON "public"."cdc_heartbeat" TO "cdc_stream"' in role_sql
