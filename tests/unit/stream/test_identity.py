"""How far an exactly-once checkpoint holds on a server: only on the WAL history it was written on."""

from __future__ import annotations

import pytest

from cdc.errors import CheckpointError
from cdc.stream.identity import ServerIdentity, TimelineSwitch, parse_timeline_history, skip_bound

# A server on timeline 3: timeline 1 ended at 0/5000000, timeline 2 at 0/9000000.
HISTORY = b"1\t0/5000000\tno recovery target specified\n\n2\t0/9000000\tbefore 2026-12-05 04:00:00+00\n"
SERVER = ServerIdentity("7412", 3, 0xA000000, parse_timeline_history(HISTORY))


def test_the_history_file_is_read_line_by_line():
    assert SERVER.history == (TimelineSwitch(1, 0x5000000), TimelineSwitch(2, 0x9000000))
    assert parse_timeline_history(b"# comment\n\n") == ()
    with pytest.raises(CheckpointError, match="line 1"):
        parse_timeline_history(b"1 nonsense\n")


def test_a_checkpoint_of_this_timeline_holds_whole():
    bound = skip_bound(end_lsn=0x9800000, system_id="7412", timeline=3, server=SERVER)
    assert (bound.lsn, bound.note) == (0x9800000, None)


def test_a_checkpoint_of_another_system_holds_nothing():
    bound = skip_bound(end_lsn=0x100, system_id="9999", timeline=3, server=SERVER)
    assert bound.lsn == 0 and "another PostgreSQL system" in (bound.note or "")
    # a checkpoint of an older release, which did not say
    assert skip_bound(end_lsn=0x100, system_id=None, timeline=None, server=SERVER).lsn == 0


def test_a_checkpoint_of_an_older_timeline_holds_only_below_the_switch_point():
    # Written on timeline 1 at 0/7000000, but this server left timeline 1 at 0/5000000 (a promoted standby
    # that was behind): what commits between the two is another history's.
    bound = skip_bound(end_lsn=0x7000000, system_id="7412", timeline=1, server=SERVER)
    assert bound.lsn == 0x5000000 and "left at 0/5000000" in (bound.note or "")
    # below the switch point it holds whole
    assert skip_bound(end_lsn=0x4000000, system_id="7412", timeline=2, server=SERVER).lsn == 0x4000000


def test_a_checkpoint_of_a_timeline_not_in_the_history_holds_nothing():
    for timeline in (4, 7):  # a sibling or a later timeline: not ours
        bound = skip_bound(end_lsn=0x100, system_id="7412", timeline=timeline, server=SERVER)
        assert bound.lsn == 0 and "not in the history" in (bound.note or "")


def test_a_checkpoint_past_the_end_of_wal_holds_nothing():
    bound = skip_bound(end_lsn=0xB000000, system_id="7412", timeline=3, server=SERVER)
    assert bound.lsn == 0 and "past this server's end of WAL" in (bound.note or "")
