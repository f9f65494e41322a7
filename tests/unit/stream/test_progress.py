"""When `cdc run` saves the acknowledged position for `cdc recover` (cdc.stream.progress): at most every
status_interval, only when a new outbox transaction is covered by the confirmed position."""

from __future__ import annotations

from cdc.config import Settings
from cdc.stream.progress import PositionWriter


class Recording(PositionWriter):
    def __init__(self) -> None:
        super().__init__(Settings(database_url="postgresql://u@h/db", status_interval=10.0))
        self.saved: list[tuple[int, int]] = []

    def save(self, confirmed_lsn: int, commit_us: int) -> None:
        self.saved.append((confirmed_lsn, commit_us))
        self._saved_commit_us = commit_us


def test_nothing_is_saved_before_an_outbox_transaction_is_acknowledged():
    writer = Recording()
    writer.offer(0.0, 500, (0, 0))
    assert writer.saved == []


def test_a_transaction_beyond_the_confirmed_position_waits():
    """Exactly-once: acknowledged but not yet committed in Kafka, so not confirmed: not saved yet."""
    writer = Recording()
    writer.offer(0.0, 200, (300, 7))
    assert writer.saved == []
    writer.offer(0.1, 300, (300, 7))
    assert writer.saved == [(300, 7)]


def test_saves_are_at_most_every_status_interval_and_only_when_new():
    writer = Recording()
    writer.offer(0.0, 300, (300, 7))
    writer.offer(5.0, 400, (400, 8))
    assert writer.saved == [(300, 7)], "within the interval"
    writer.offer(10.0, 400, (400, 8))
    assert writer.saved == [(300, 7), (400, 8)]
    writer.offer(30.0, 500, (400, 8))
    assert writer.saved == [(300, 7), (400, 8)], "nothing new: an idle outbox writes nothing"
    writer.offer(float("inf"), 600, (600, 9))  # at shutdown
    assert writer.saved[-1] == (600, 9)
