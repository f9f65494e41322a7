"""The fault schedule of one run: which fault, when, for how long; a pure function of the seed.

A seed replays the same schedule (the same faults at the same offsets from the start of the load, with the
same hold times); what the machine makes of them differs from run to run, which is why a failing seed is
worth running again, and why the suite is run many times.

Faults, for a run of ``duration`` seconds:

- ``kill_pipeline``: ``kill -9`` of ``cdc run``; the supervisor restarts it after ``hold`` (0-3 s). At least
  12, about one every 13 s, and one inside the registry outage (so a restart has to wait for the registry).
- ``kill_broker``: ``kill -9`` of the Kafka broker, down ``hold`` (20-25 s), then restarted by the stack
  script.
- ``restart_postgres``: ``pg_ctl restart -m immediate`` (a crash and recovery, as far as clients can tell).
- ``kill_walsender``: ``pg_terminate_backend`` of the slot's walsender, twice.
- ``registry_down``: the schema registry unreachable for ``hold`` (15-25 s) when the framing is confluent;
  or, for half the seeds, ``freeze_registry``: its connections kept open and silent for as long.
- Silence (issue 25), of PostgreSQL and of the broker, each of the two kinds by seed: ``freeze_pg``, every
  connection open from ``cdc run`` to PostgreSQL frozen for good (open, forwarding nothing; new ones pass),
  ``hold`` being how long the recovery is watched for; or ``freeze_pg_all``, every connection, new ones too,
  frozen for ``hold`` (30-40 s), then thawed. ``freeze_broker`` and ``freeze_broker_all`` do the same to
  every client connection to the broker (it advertises the suite's proxy).
- ``big_transaction``: one transaction of ``big_rows`` rows, committed while the rest goes on.
- ``advance_slot`` (only with ``sabotage``): the pipeline is stopped, the slot is advanced to the current
  WAL position behind its back, and the pipeline restarted: the suite must then report missing events.

The infrastructure faults (broker, PostgreSQL, walsender, registry) never overlap one another, so each one's
effect can be told apart in the logs; pipeline kills fall anywhere, outages included.

On the three-broker cluster (``--brokers 3``, :func:`make_cluster_schedule`) the outages are the cluster's
instead (``tests/faults/cluster.py``), each at its time or once the one before it has ended and every replica
is back in sync, whichever comes later:

- ``kill_leader``: ``kill -9`` of the broker that leads the busiest partition of the run's first topic, down
  ``hold`` (10-20 s), then restarted.
- ``stop_broker``: a controlled shutdown (SIGTERM, waited for) of the leader of the second topic's busiest
  partition, down ``hold`` (5-15 s), then restarted.
- ``rolling_restart``: b1, b2, b3 in turn: SIGTERM, restart, and every replica back in sync before the next.
- ``isr_below_min``: two brokers down (one ``kill -9``, one SIGTERM), so that every partition has one in-sync
  replica, below ``min.insync.replicas = 2``, for ``hold`` (25-35 s): the producer must wait, then resume.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MIN_PIPELINE_KILLS = 12
MIN_DURATION = 200
FREEZE_WATCH = 20.0  # the window a freeze for good takes in the schedule (its effect may outlast it)
OUTAGES = ("kill_broker", "restart_postgres", "kill_walsender", "registry_down", "freeze_registry")
OUTAGES += ("freeze_pg", "freeze_pg_all", "freeze_broker", "freeze_broker_all")


@dataclass(frozen=True, slots=True)
class Fault:
    at: float  # seconds after the load started
    kind: str
    hold: float = 0.0  # how long the fault lasts (outages), or the restart delay (pipeline kills)

    def describe(self) -> str:
        hold = f" for {self.hold:.1f} s" if self.hold else ""
        return f"t+{self.at:6.1f} s {self.kind}{hold}"


def make_schedule(
    seed: int, duration: float, *, registry: bool = True, big_rows: int = 0, sabotage: bool = False
) -> list[Fault]:
    """The faults of one run, in time order."""
    if duration < MIN_DURATION:
        raise ValueError(f"a fault run needs at least {MIN_DURATION} s to fit its outages one after another")
    rng = random.Random(seed)
    faults: list[Fault] = []

    # Infrastructure outages in disjoint windows, in a random order, leaving the last 15 s quiet so that the
    # pipeline's last restart meets a healthy stack.
    outages = [("kill_broker", rng.uniform(20, 25)), ("restart_postgres", 0.0)]
    outages += [("kill_walsender", 0.0), ("kill_walsender", 0.0)]
    for peer in ("pg", "broker"):
        if rng.random() < 0.5:
            outages.append((f"freeze_{peer}", FREEZE_WATCH))
        else:
            outages.append((f"freeze_{peer}_all", rng.uniform(30, 40)))
    if registry:
        outages.append(("registry_down" if rng.random() < 0.5 else "freeze_registry", rng.uniform(15, 25)))
    rng.shuffle(outages)
    start, end = 8.0, duration - 15.0
    busy = sum(hold + 6 for _, hold in outages)  # 6 s of calm after each before the next may come
    slack = max(0.0, (end - start) - busy)
    # Cut the slack at random points: the outages keep their order, the gaps between them vary.
    cuts = sorted(rng.uniform(0, slack) for _ in outages)
    at = start
    previous_cut = 0.0
    registry_window: tuple[float, float] | None = None
    for (kind, hold), cut in zip(outages, cuts, strict=True):
        at += cut - previous_cut
        previous_cut = cut
        faults.append(Fault(round(at, 2), kind, round(hold, 2)))
        if kind in ("registry_down", "freeze_registry"):
            registry_window = (at, at + hold)
        at += hold + 6

    kills = max(MIN_PIPELINE_KILLS, round(duration / 13))
    # One kill somewhere in each of ``kills`` equal slots: spread over the run, never two in a row.
    first, last = 4.0, duration - 10
    slot = (last - first) / kills
    times = [first + i * slot + rng.uniform(0.15, 0.85) * slot for i in range(kills)]
    if registry_window is not None:
        lo, hi = registry_window
        times.append(rng.uniform(lo + 2, max(lo + 2.5, hi - 4)))
    faults += [Fault(round(t, 2), "kill_pipeline", round(rng.uniform(0, 3), 2)) for t in times]

    if big_rows:
        faults.append(Fault(round(rng.uniform(0.1, 0.4) * duration, 2), "big_transaction"))
    if sabotage:
        faults.append(Fault(round(rng.uniform(0.3, 0.6) * duration, 2), "advance_slot"))
    return sorted(faults, key=lambda f: (f.at, f.kind))


MIN_CLUSTER_DURATION = 150
CLUSTER_OUTAGES = ("kill_leader", "stop_broker", "rolling_restart", "isr_below_min")


def make_cluster_schedule(
    seed: int, duration: float, *, big_rows: int = 0, sabotage: bool = False
) -> list[Fault]:
    """The faults of one run on the three-broker cluster, in time order. The outages are spread over the
    run; as each waits for the one before it (and for the replicas to catch up), a slow machine stretches
    them past ``duration``, and the run waits for the last one."""
    if duration < MIN_CLUSTER_DURATION:
        raise ValueError(f"a cluster fault run needs at least {MIN_CLUSTER_DURATION} s for its four outages")
    rng = random.Random(seed)
    outages = [("kill_leader", rng.uniform(10, 20)), ("stop_broker", rng.uniform(5, 15))]
    outages += [("rolling_restart", 0.0), ("isr_below_min", rng.uniform(25, 35))]
    rng.shuffle(outages)
    # What each takes beside its hold, on a 2-core machine: restarts (about 10 s a broker) and the wait
    # for the replicas to catch up; a rolling restart is three of them.
    cost = {"kill_leader": 15.0, "stop_broker": 15.0, "rolling_restart": 45.0, "isr_below_min": 25.0}
    start, end = 8.0, duration - 15.0
    slack = max(0.0, (end - start) - sum(hold + cost[kind] for kind, hold in outages))
    cuts = sorted(rng.uniform(0, slack) for _ in outages)
    faults, at, previous_cut = [], start, 0.0
    for (kind, hold), cut in zip(outages, cuts, strict=True):
        at += cut - previous_cut
        previous_cut = cut
        faults.append(Fault(round(at, 2), kind, round(hold, 2)))
        at += hold + cost[kind]

    kills = max(MIN_PIPELINE_KILLS, round(duration / 13))
    first, last = 4.0, duration - 10
    slot = (last - first) / kills
    times = [first + i * slot + rng.uniform(0.15, 0.85) * slot for i in range(kills)]
    faults += [Fault(round(t, 2), "kill_pipeline", round(rng.uniform(0, 3), 2)) for t in times]
    if big_rows:
        faults.append(Fault(round(rng.uniform(0.1, 0.4) * duration, 2), "big_transaction"))
    if sabotage:
        faults.append(Fault(round(rng.uniform(0.3, 0.6) * duration, 2), "advance_slot"))
    return sorted(faults, key=lambda f: (f.at, f.kind))


def counts(faults: list[Fault]) -> dict[str, int]:
    out: dict[str, int] = {}
    for fault in faults:
        out[fault.kind] = out.get(fault.kind, 0) + 1
    return out
