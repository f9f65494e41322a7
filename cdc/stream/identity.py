"""Whose WAL is this? The server's and the slot's identity, and how far an exactly-once checkpoint holds.

An LSN is a position in one server's WAL history, and means nothing without it: the same number on another
cluster, or on a standby promoted after it fell behind, names another transaction. So the exactly-once
checkpoint (:mod:`cdc.stream.transactions`) carries the history it was written on, and is keyed by it:

- the **system identifier** (``IDENTIFY_SYSTEM``): made by ``initdb``, kept by physical standbys and their
  promotions, different for every other cluster (another service's database of the same name, a cluster the
  database was dumped into);
- the **slot's identity**: its name and the LSN it was created at (``cdc setup`` or ``cdc recover`` note it
  in ``cdc_checkpoint``), so that a slot made again under the same name is a new key;
- the **timeline** it was written on. After a promotion the new timeline shares the old one's WAL only up to
  the switch point in its history file (``TIMELINE_HISTORY``): a checkpoint of the old timeline holds below
  that point, and nothing above it is the same transaction.

:func:`skip_bound` turns a checkpoint and the server's identity into the LSN below which source transactions
are in Kafka already. A checkpoint it cannot vouch for (another timeline not in the history, a position the
server has not even written) holds nothing: the price is duplicates, never a skipped event.

None of these tells two histories with one system identifier and timeline apart: a server restored from a
disk snapshot keeps both, and writes new transactions at the LSNs of the lost ones. A bound that is the
checkpoint itself is therefore provisional until the checkpoint's own transaction (end LSN, xid, commit
time) is read back from the slot (:mod:`cdc.stream.exactly_once`); this module only says where.

Pure: the replication connection (:mod:`cdc.stream.source`) asks the server, this module decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.errors import CheckpointError, format_lsn, parse_lsn


@dataclass(frozen=True, slots=True)
class TimelineSwitch:
    """One line of a timeline history file: ``timeline`` ended at ``switchpoint`` (the next one began)."""

    timeline: int
    switchpoint: int


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What ``IDENTIFY_SYSTEM`` (and, past timeline 1, ``TIMELINE_HISTORY``) said when the stream started."""

    system_id: str
    timeline: int
    flush_lsn: int  # how far the server had flushed WAL then
    history: tuple[TimelineSwitch, ...] = ()

    def switchpoint(self, timeline: int) -> int | None:
        """Where ``timeline`` ended in this server's history; None when it is not an ancestor of ours."""
        for switch in self.history:
            if switch.timeline == timeline:
                return switch.switchpoint
        return None


@dataclass(frozen=True, slots=True)
class SlotIdentity:
    """A slot on a server: the key of its checkpoint, and what its transactional id is made of."""

    system_id: str
    slot: str
    created_lsn: int | None  # None: a slot of a setup that did not note it

    @property
    def key(self) -> bytes:
        created = "" if self.created_lsn is None else f"@{format_lsn(self.created_lsn)}"
        return f"{self.system_id}/{self.slot}{created}".encode()


def parse_timeline_history(content: bytes) -> tuple[TimelineSwitch, ...]:
    """A ``<timeline>.history`` file: lines ``parent-timeline <TAB> switchpoint <TAB> reason``; comments and
    blank lines are allowed."""
    switches = []
    for number, raw in enumerate(content.decode("utf-8", "replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        try:
            switches.append(TimelineSwitch(int(fields[0]), parse_lsn(fields[1])))
        except (IndexError, ValueError) as exc:
            raise CheckpointError(
                f"timeline history line {number} is not 'timeline switchpoint': {line!r}"
            ) from exc
    return tuple(switches)


@dataclass(frozen=True, slots=True)
class SkipBound:
    """Source transactions that commit below ``lsn`` are in Kafka already; ``note`` says why the bound is
    lower than the checkpoint, when it is."""

    lsn: int
    note: str | None = None


def skip_bound(
    *, end_lsn: int, system_id: str | None, timeline: int | None, server: ServerIdentity
) -> SkipBound:
    """How much of a checkpoint (``end_lsn`` written on ``system_id`` / ``timeline``) holds on ``server``."""
    where = f"checkpoint {format_lsn(end_lsn)}"
    if system_id != server.system_id:
        return SkipBound(
            0, f"{where} was written on another PostgreSQL system ({system_id}): nothing is skipped"
        )
    bound = end_lsn
    note = None
    if timeline is not None and timeline != server.timeline:
        switch = server.switchpoint(timeline)
        if switch is None:
            return SkipBound(
                0,
                f"{where} was written on timeline {timeline}, which is not in the history of this server's "
                f"timeline {server.timeline}: nothing is skipped",
            )
        if switch < bound:
            bound = switch
            note = (
                f"{where} was written on timeline {timeline}, which this server left at "
                f"{format_lsn(switch)} (timeline {server.timeline}): only what commits below it is skipped"
            )
    if bound > server.flush_lsn:
        return SkipBound(
            0,
            f"{where} is past this server's end of WAL {format_lsn(server.flush_lsn)}, so it was written on "
            "another history (a restored or rebuilt cluster that has not written as much yet): nothing is "
            "skipped",
        )
    return SkipBound(bound, note)
