"""What `cdc audit` makes of a record (cdc.ops.audit_read) and of a --since / --until (cdc.cli.audit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cdc.cli.audit import parse_moment
from cdc.errors import ConfigError
from cdc.ops.audit_read import dead_letter_row, event_row
from tests.unit.fake_message import Message

STAMP = datetime.fromtimestamp(1_700_000_000, UTC)
NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)


def test_an_event_record_is_its_id():
    assert event_row(Message(_headers=[("id", b"e-1"), ("event_type", b"X")])) == (
        "p",
        "e-1",
        STAMP,
        None,
        None,
        None,
    )


def test_a_record_without_an_event_id_is_no_event():
    assert event_row(Message(_headers=[("event_type", b"X")])) is None
    assert event_row(Message(_headers=[("id", b"")])) is None


def test_a_dead_letter_keeps_its_position_for_the_markers():
    letter = Message(_headers=[("error_reason", b"payload_invalid"), ("id", b"e-2")])
    assert dead_letter_row(letter) == ("d", "e-2", STAMP, "2:41", None, None)


@pytest.mark.parametrize(
    ("header", "how"), [("replayed_to", "replayed"), ("discarded_by", "discarded"), ("other", "resolved")]
)
def test_a_marker_says_which_letter_it_resolves_and_how(header, how):
    marker = Message(_value=None, _headers=[("cdc_dlq_resolved", b"1:7"), (header, b"x")])
    assert dead_letter_row(marker) == ("m", "", STAMP, None, "1:7", how)


def test_a_letter_of_a_malformed_change_has_no_row_to_match():
    assert dead_letter_row(Message(_headers=[("error_reason", b"malformed")])) is None


def test_since_is_a_time_or_a_duration_before_now():
    assert parse_moment("24h", "--since", NOW) == NOW - timedelta(hours=24)
    assert parse_moment("2026-12-01T00:00:00Z", "--since", NOW) == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_moment("2026-12-01T00:00:00", "--since", NOW) == datetime(2026, 12, 1, tzinfo=UTC)
    with pytest.raises(ConfigError, match="--until 'yesterday' is neither a time") as raised:
        parse_moment("yesterday", "--until", NOW)
    assert raised.value.key == "until"
