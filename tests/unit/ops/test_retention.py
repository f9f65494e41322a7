from __future__ import annotations

from datetime import timedelta

import pytest

from cdc.config_loader import load_settings
from cdc.errors import ConfigError
from cdc.ops.retention import parse_duration, prune


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("12h", timedelta(hours=12)),
        ("1h30m", timedelta(minutes=90)),
        ("90s", timedelta(seconds=90)),
        ("2w", timedelta(weeks=2)),
        (" 1d 2h ", timedelta(hours=26)),
    ],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "1x", "d7", "-1d", "0s", "1.5h"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(ConfigError, match="--older-than"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["1x", "0s"])
def test_a_bad_duration_names_the_option_it_was_given_for(text):
    with pytest.raises(ConfigError, match="--margin") as caught:
        parse_duration(text, "--margin")
    assert "--older-than" not in str(caught.value) and caught.value.key == "margin"


def test_prune_without_a_creation_time_column_explains_the_alternatives():
    settings = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"columns": "debezium"},
    )
    with pytest.raises(ConfigError, match="partition the table by time") as info:
        prune(settings, timedelta(days=1))
    assert info.value.key == "columns.created_at"
