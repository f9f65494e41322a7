"""The pure parts of `cdc outbox republish` and `cdc recover`: times as the operator types them, and the
rows a filter chooses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql

from cdc.cli.recovery import parse_time
from cdc.config_loader import load_settings
from cdc.errors import ConfigError
from cdc.ops.republish import RowFilter, _where


def settings(**overrides):
    return load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides=overrides
    )


def test_a_time_is_iso_8601_utc_without_an_offset_or_a_duration_ago():
    assert parse_time("2026-12-03T10:00:00+01:00", "--since") == datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    assert parse_time("2026-12-03T10:00:00Z", "--since") == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert parse_time("2026-12-03 10:00", "--since") == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    ago = datetime.now(UTC) - parse_time("1h30m", "--since")
    assert timedelta(hours=1, minutes=29) < ago < timedelta(hours=1, minutes=31)


def test_a_time_that_is_neither_names_the_option():
    with pytest.raises(ConfigError, match=r"--until 'yesterday' is not a time") as caught:
        parse_time("yesterday", "--until")
    assert caught.value.key == "until"


def test_a_filter_is_an_and_of_its_kinds_and_an_or_within_one():
    where, params = _where(
        settings(), RowFilter(since=datetime(2026, 1, 1, tzinfo=UTC), event_types=("A", "B"), ids=("x",))
    )
    text = where.as_string(None)
    assert text == '"created_at" >= %s AND "event_type"::text = ANY(%s) AND "id"::text = ANY(%s)'
    assert params == [datetime(2026, 1, 1, tzinfo=UTC), ["A", "B"], ["x"]]
    assert _where(settings(), RowFilter())[0] == sql.SQL("true")


def test_times_need_the_creation_column_which_the_debezium_preset_lacks():
    with pytest.raises(
        ConfigError,
        match=r"ADD COLUMN created_at .* then map it: columns = \{ preset = \"debezium\", created_at",
    ) as caught:
        _where(settings(columns="debezium"), RowFilter(until=datetime(2026, 1, 1, tzinfo=UTC)))
    assert caught.value.key == "columns.created_at"
    where, _ = _where(settings(columns="debezium"), RowFilter(aggregate_types=("order",)))
    assert where.as_string(None) == '"aggregatetype"::text = ANY(%s)'
