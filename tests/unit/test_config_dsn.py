"""Mistakes in database_url and in the names of settings, caught when the settings are read (issue 43,
item 5): exit 2, one line naming database_url (or the setting) and the fix, never the password."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc.cli import main
from cdc.config_loader import load_settings
from cdc.errors import ConfigError

PASSWORD = "Zq9xx7-Pl4nt"


def refused(url: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=None, environ={"CDC_DATABASE_URL": url}, overrides={})
    err = info.value
    assert err.key == "database_url" and err.exit_code == 2
    text = str(err)
    assert text.startswith("setting 'database_url' (from CDC_DATABASE_URL)"), text
    assert PASSWORD not in text and "Zq9" not in text, text
    return text


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"host=db port=54x32 password={PASSWORD}", "has port '54x32', which is not a port number (1-65535)"),
        (f"postgresql://cdc:{PASSWORD}@db:99999/app", "has port 99999, which is not a port number"),
        (f"postgresql://cdc:{PASSWORD}@db:54x32/app", "has a port that is not a number (not shown"),
        # A '/' in the password of a URI: libpq reads host 'cdc', port 'Zq9...': named as an encoding fix.
        ("postgresql://cdc:Zq9/xx7@db:5432/app", "'/' as %2F"),
        (f"postgresql://cdc:{PASSWORD}@db/app?sslmod=require", "keyword 'sslmod', which libpq does not know: "
         "did you mean 'sslmode'?"),
        (f"sslmod=require host=db password={PASSWORD}", "did you mean 'sslmode'?"),
        (f"postgresql://cdc:{PASSWORD}@db/app?sslmode=requir", "has sslmode 'requir', which libpq does not "
         "take: did you mean 'require'?"),
        (f"host=db sslmode=verify_full password={PASSWORD}", "did you mean 'verify-full'?"),
        (f"postgresql://cdc:{PASSWORD}@db/app?target_session_attrs=readwrite", "did you mean 'read-write'"),
        (f"postgresql://cdc:{PASSWORD}@db/app?connect_timeout=10s", "connect_timeout that is not a whole"),
        (f"http://cdc:{PASSWORD}@db:5432/app", "is a URI of scheme 'http://': libpq reads postgresql://"),
        (f"jdbc:postgresql://db:5432/app?password={PASSWORD}", "drop the 'jdbc:' prefix"),
        (f"host=db password='{PASSWORD}", "is not a connection string libpq can read"),
    ],
)  # fmt: skip
def test_a_mistake_in_database_url_is_refused_naming_it(url, said):
    assert said in refused(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://cdc@db:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem",
        "postgres://cdc@db/app",
        "postgresql://cdc@db1:5432,db2:5433/app?target_session_attrs=read-write&connect_timeout=5",
        "host=db1,db2 port=5432,5433 dbname=app user=cdc password='a b' sslmode=prefer",
        "postgresql://cdc:p%2Fss%40w@db:5432/app",
        "postgresql:///app?host=/var/run/postgresql",
        "dbname=app",
    ],
)
def test_good_urls_pass(url):
    load_settings(config_file=None, environ={"CDC_DATABASE_URL": url}, overrides={})


def test_the_cli_exits_2_at_configuration_time_naming_database_url():
    done = CliRunner().invoke(
        main, ["status"], env={"CDC_DATABASE_URL": f"postgresql://cdc:{PASSWORD}@127.0.0.1:54x32/app"}
    )
    assert done.exit_code == 2, done.output
    assert "setting 'database_url'" in done.output and PASSWORD not in done.output


def test_kafka_bootstrap_servers_at_the_top_of_the_file_hints_at_the_kafka_table(tmp_path: Path):
    config = tmp_path / "cdc.toml"
    config.write_text('database_url = "dbname=app"\nkafka_bootstrap_servers = "k:9092"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=config, environ={}, overrides={})
    assert "did you mean 'bootstrap_servers' in the [kafka] table" in str(info.value), info.value


def test_a_kafka_variable_a_letter_away_from_ours_is_named():
    with pytest.raises(ConfigError) as info:
        load_settings(
            config_file=None,
            environ={"CDC_DATABASE_URL": "dbname=app", "CDC_KAFKA_BOOTSTRAP_SERVER": "k:9092"},
            overrides={},
        )
    assert "did you mean CDC_KAFKA_BOOTSTRAP_SERVERS?" in str(info.value), info.value
    # librdkafka's own keys near one of ours are still librdkafka's.
    settings = load_settings(
        config_file=None,
        environ={
            "CDC_DATABASE_URL": "dbname=app",
            "CDC_KAFKA_SASL_PASSWORD": "x",
            "CDC_KAFKA_SASL_USERNAME": "u",
        },
        overrides={},
    )
    assert settings.kafka.extra["sasl.password"] == "x"


def test_a_missing_schemas_dir_is_named_with_its_absolute_path(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(main, ["schemas", "check", "--schemas-dir", "schemas"])
    assert done.exit_code != 0
    assert f"{tmp_path / 'schemas'}, relative to the working directory {tmp_path}" in done.output, done.output
