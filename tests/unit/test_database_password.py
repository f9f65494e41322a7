"""The database password from a file or a command, read at every connect (cdc.pg.database_dsn): pure parts
(no server: a Settings and the file system, /bin/sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.config import Settings
from cdc.config_loader import load_settings
from cdc.errors import ConfigError, SourceConnectionError
from cdc.pg import database_dsn

URL = "postgresql://cdc@db.internal:5432/shop"


def test_without_a_source_the_url_is_used_as_it_is():
    assert database_dsn(Settings(database_url=URL)) == URL


def test_the_file_is_read_at_every_call(tmp_path: Path):
    secret = tmp_path / "password"
    secret.write_text("first-secret\n")
    settings = Settings(database_url=URL, database_password_file=str(secret))
    assert conninfo_to_dict(database_dsn(settings))["password"] == "first-secret"
    secret.write_text("rotated 's3cr3t'")
    params = conninfo_to_dict(database_dsn(settings))
    assert params["password"] == "rotated 's3cr3t'"
    assert (params["host"], params["user"], params["dbname"]) == ("db.internal", "cdc", "shop")


def test_the_command_runs_at_every_call_and_its_failure_never_shows_its_output(tmp_path: Path):
    counter = tmp_path / "n"
    command = f"echo x >> {counter}; printf 'token-%s' $(wc -l < {counter})"
    settings = Settings(database_url=URL, database_password_command=command)
    assert conninfo_to_dict(database_dsn(settings))["password"] == "token-1"
    assert conninfo_to_dict(database_dsn(settings))["password"] == "token-2"
    failing = Settings(database_url=URL, database_password_command="echo hunter2; echo expired >&2; exit 3")
    with pytest.raises(SourceConnectionError) as err:
        database_dsn(failing)
    assert "exited 3: expired" in str(err.value) and "hunter2" not in str(err.value)


def test_a_missing_file_or_a_slow_command_is_a_connection_failure(tmp_path: Path):
    with pytest.raises(SourceConnectionError, match="cannot read database_password_file"):
        database_dsn(Settings(database_url=URL, database_password_file=str(tmp_path / "nope")))
    slow = Settings(database_url=URL, database_password_command="sleep 5", query_timeout=1)
    with pytest.raises(SourceConnectionError, match="did not finish within 1 s"):
        database_dsn(slow)


def test_one_source_at_a_time_and_no_password_in_the_url_beside_it(tmp_path: Path):
    env = {"CDC_DATABASE_URL": URL, "CDC_DATABASE_PASSWORD_FILE": "/run/secrets/db"}
    assert (
        load_settings(config_file=None, environ=env, overrides={}).database_password_file == "/run/secrets/db"
    )
    with pytest.raises(ConfigError) as both:
        load_settings(config_file=None, environ={**env, "CDC_DATABASE_PASSWORD_COMMAND": "x"}, overrides={})
    assert both.value.key == "database_password_command"
    with_password = {**env, "CDC_DATABASE_URL": "postgresql://cdc:pw@db.internal/shop"}
    with pytest.raises(ConfigError) as twice:
        load_settings(config_file=None, environ=with_password, overrides={})
    assert twice.value.key == "database_password_file" and "pw" not in str(twice.value).replace(
        "password", ""
    )
