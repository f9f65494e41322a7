"""The fault suite's own judge and schedule: a verdict that misses a loss would make every run a pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.faults.check import Ledger, Seen, analyze
from tests.faults.schedule import (
    CLUSTER_OUTAGES,
    MIN_CLUSTER_DURATION,
    MIN_DURATION,
    MIN_PIPELINE_KILLS,
    OUTAGES,
    counts,
    make_cluster_schedule,
    make_schedule,
)


def ledger(*events: tuple[str, str, int], rolled_back: tuple[str, ...] = ()) -> Ledger:
    return Ledger(committed={i: (a, s) for i, a, s in events}, rolled_back=set(rolled_back))


def seen(id_: str, aggregate: str, seq: int, offset: int, partition: int = 0, topic: str = "t") -> Seen:
    return Seen(topic, partition, offset, aggregate, id_, aggregate, seq)


def test_everything_once_and_in_order_is_clean():
    book = ledger(("e1", "a", 1), ("e2", "a", 2), ("e3", "b", 1))
    verdict = analyze(
        book, [seen("e1", "a", 1, 0), seen("e3", "b", 1, 0, partition=1), seen("e2", "a", 2, 1)]
    )
    assert verdict.violations() == []
    assert (verdict.records, verdict.distinct, verdict.duplicates) == (3, 3, 0)


def test_a_committed_event_that_never_arrived_is_missing():
    verdict = analyze(ledger(("e1", "a", 1), ("e2", "a", 2)), [seen("e2", "a", 2, 0)])
    assert verdict.missing == ["e1"]
    assert verdict.violations()[0].startswith("missing=1")


def test_duplicates_are_counted_not_failed_and_only_first_copies_are_ordered():
    book = ledger(("e1", "a", 1), ("e2", "a", 2))
    # e1 e2 e1 e2: a replay after a restart; the first copies are in order.
    records = [seen("e1", "a", 1, 0), seen("e2", "a", 2, 1), seen("e1", "a", 1, 2), seen("e2", "a", 2, 3)]
    verdict = analyze(book, records)
    assert verdict.violations() == []
    assert verdict.duplicates == 2


def test_first_copies_out_of_commit_order_are_an_order_violation():
    book = ledger(("e1", "a", 1), ("e2", "a", 2))
    verdict = analyze(book, [seen("e2", "a", 2, 0), seen("e1", "a", 1, 1)])
    assert len(verdict.order_violations) == 1
    assert "seq 1 after seq 2" in verdict.order_violations[0]


def test_records_are_ordered_by_offset_whatever_order_they_are_handed_in():
    book = ledger(("e1", "a", 1), ("e2", "a", 2))
    assert analyze(book, [seen("e2", "a", 2, 1), seen("e1", "a", 1, 0)]).violations() == []


def test_rolled_back_and_unknown_ids_are_violations():
    book = ledger(("e1", "a", 1), rolled_back=("r1",))
    verdict = analyze(book, [seen("e1", "a", 1, 0), seen("r1", "a", 5, 1), seen("x9", "a", 6, 2)])
    assert verdict.rolled_back_seen == ["r1"]
    assert verdict.unknown == ["x9"]


def test_a_key_on_two_partitions_is_a_violation():
    book = ledger(("e1", "a", 1), ("e2", "a", 2))
    verdict = analyze(book, [seen("e1", "a", 1, 0, partition=0), seen("e2", "a", 2, 0, partition=1)])
    assert verdict.split_keys == ["t/a on partitions [0, 1]"]


def test_a_payload_that_does_not_match_its_ledger_entry_is_a_violation():
    verdict = analyze(ledger(("e1", "a", 1)), [seen("e1", "a", 7, 0)])
    assert verdict.mismatched and verdict.violations()


def test_dead_letters_count_as_arrived_but_are_reported():
    verdict = analyze(ledger(("e1", "a", 1)), [], [Seen("dlq", 0, 0, None, "e1")])
    assert verdict.missing == []
    assert verdict.dead_letters == 1
    assert any(v.startswith("dead_letters=1") for v in verdict.violations())


def test_a_failed_fact_is_a_violation():
    verdict = analyze(ledger(), [])
    verdict.facts = {"sigterm_exit_0": False, "second_run_publishes_nothing": True}
    assert verdict.violations() == ["sigterm_exit_0 failed"]


@pytest.mark.parametrize("seed", range(11, 19))
@pytest.mark.parametrize("duration", [MIN_DURATION, 240, 600])
def test_the_schedule_holds_every_fault_the_suite_promises(duration, seed):
    faults = make_schedule(seed, duration, registry=True, big_rows=10, sabotage=True)
    n = counts(faults)
    assert n["kill_pipeline"] >= MIN_PIPELINE_KILLS + 1  # one more inside the registry outage
    assert (n["kill_broker"], n["restart_postgres"], n["kill_walsender"]) == (1, 1, 2)
    assert n.get("registry_down", 0) + n.get("freeze_registry", 0) == 1
    assert n.get("freeze_pg", 0) + n.get("freeze_pg_all", 0) == 1, "one silence of PostgreSQL per run"
    assert n.get("freeze_broker", 0) + n.get("freeze_broker_all", 0) == 1, "one silence of Kafka per run"
    assert (n["big_transaction"], n["advance_slot"]) == (1, 1)
    broker = next(f for f in faults if f.kind == "kill_broker")
    assert broker.hold >= 20
    assert all(0 <= f.at <= duration for f in faults)
    outages = [f for f in faults if f.kind in OUTAGES]
    for a, b in zip(outages, outages[1:], strict=False):
        assert a.at + a.hold < b.at, f"{a.describe()} overlaps {b.describe()}"
    assert outages[-1].at + outages[-1].hold <= duration - 15 + 6, "the last outage ends before the quiet end"
    registry = next(f for f in faults if f.kind in ("registry_down", "freeze_registry"))
    assert any(
        registry.at < f.at < registry.at + registry.hold for f in faults if f.kind == "kill_pipeline"
    ), "no pipeline start meets the registry outage"


def test_a_seed_replays_its_schedule_and_another_seed_does_not():
    assert make_schedule(5, 240) == make_schedule(5, 240)
    assert make_schedule(5, 240) != make_schedule(6, 240)


def test_a_run_too_short_for_its_outages_is_refused():
    with pytest.raises(ValueError, match="at least"):
        make_schedule(1, MIN_DURATION - 1)


def test_the_time_another_outage_held_the_stack_is_not_counted_against_a_resumption():
    from tests.faults.run import Faults

    faults = Faults.__new__(Faults)
    faults._outages = [[10.0, 20.0], [15.0, 30.0], [50.0, None]]
    assert faults._blocked(12, 40, None) == 18  # overlapping outages count once
    assert faults._blocked(0, 60, faults._outages[0]) == 25  # its own outage is not another's; one lasts
    assert faults._blocked(35, 45, None) == 0


@pytest.mark.parametrize("seed", range(11, 19))
@pytest.mark.parametrize("duration", [MIN_CLUSTER_DURATION, 200, 600])
def test_the_cluster_schedule_holds_each_cluster_fault_once_and_no_single_broker_outage(duration, seed):
    faults = make_cluster_schedule(seed, duration, big_rows=10, sabotage=True)
    n = counts(faults)
    assert {kind: n.get(kind, 0) for kind in CLUSTER_OUTAGES} == dict.fromkeys(CLUSTER_OUTAGES, 1)
    assert not set(n) & set(OUTAGES), "the single broker's outages have no place on the cluster"
    assert n["kill_pipeline"] >= MIN_PIPELINE_KILLS
    assert (n["big_transaction"], n["advance_slot"]) == (1, 1)
    isr = next(f for f in faults if f.kind == "isr_below_min")
    assert isr.hold >= 25, "the in-sync replicas must stay below the minimum for a while"
    outages = [f for f in faults if f.kind in CLUSTER_OUTAGES]
    for a, b in zip(outages, outages[1:], strict=False):
        assert a.at + a.hold < b.at, f"{a.describe()} overlaps {b.describe()}"
    assert all(0 <= f.at <= duration for f in faults)


def test_a_cluster_run_too_short_for_its_outages_is_refused():
    with pytest.raises(ValueError, match="at least"):
        make_cluster_schedule(1, MIN_CLUSTER_DURATION - 1)


def test_cis_fault_runs_are_long_enough_for_their_schedules():
    # CI's own arguments (.ci/run): a duration below the schedule's minimum fails CI at its end, after 40 min.
    text = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    runs = re.findall(r'^step make (faults(?:-cluster)?) FAULTS_ARGS="([^"]*)"', text, re.M)
    assert [target for target, _ in runs] == ["faults", "faults-cluster"], runs
    # Without --duration: make faults' default, and the one the Makefile gives faults-cluster.
    defaults = {"faults": 200.0, "faults-cluster": 150.0}
    for target, line in runs:
        given = re.search(r"--duration (\d+(?:\.\d+)?)", line)
        duration = float(given[1]) if given else defaults[target]
        if target == "faults":
            assert duration >= MIN_DURATION, f"make faults --duration {duration:g} < {MIN_DURATION}"
            make_schedule(1, duration, big_rows=200_000)
        else:
            assert duration >= MIN_CLUSTER_DURATION, f"faults-cluster --duration {duration:g}"
            make_cluster_schedule(1, duration, big_rows=100_000)
