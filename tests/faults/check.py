"""The verdict of a fault run: what the load committed against what Kafka holds (records in, verdict out).

Guarantee 1 is checked as the user would see it: every committed outbox insert is in Kafka (its topic, or the
dead-letter topic); nothing rolled back is; the first copy of each event comes in its aggregate's commit order
(per key, in partition order); a key lives on one partition only. Duplicates (at-least-once) are counted, not
failed. The slot position and the second run are checked by the harness and handed in as facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Seen:
    """One record read back from Kafka, decoded."""

    topic: str
    partition: int
    offset: int
    key: str | None
    id: str
    aggregate: str | None = None  # from the payload; None for a dead letter
    seq: int | None = None


@dataclass
class Ledger:
    """What the load generator knows: committed ids (with aggregate and sequence number) and rolled-back ids.
    A transaction whose commit outcome was unknown is in one or the other once it was looked up."""

    committed: dict[str, tuple[str, int]] = field(default_factory=dict)
    rolled_back: set[str] = field(default_factory=set)


@dataclass
class Verdict:
    committed: int = 0
    rolled_back: int = 0
    records: int = 0
    distinct: int = 0
    dead_letters: int = 0
    missing: list[str] = field(default_factory=list)
    rolled_back_seen: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # ids in Kafka that nobody wrote
    order_violations: list[str] = field(default_factory=list)
    split_keys: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # payload does not match the ledger
    facts: dict[str, bool] = field(default_factory=dict)  # checks made by the harness, True when they held

    @property
    def duplicates(self) -> int:
        return self.records - self.distinct

    def violations(self) -> list[str]:
        out = []
        for name, items in (
            ("missing", self.missing),
            ("rolled_back_seen", self.rolled_back_seen),
            ("unknown", self.unknown),
            ("order", self.order_violations),
            ("split_keys", self.split_keys),
            ("mismatched", self.mismatched),
        ):
            if items:
                out.append(f"{name}={len(items)} (e.g. {', '.join(items[:3])})")
        if self.dead_letters:
            out.append(f"dead_letters={self.dead_letters} (the load writes no bad event)")
        out += [f"{name} failed" for name, ok in self.facts.items() if not ok]
        return out


def analyze(ledger: Ledger, records: Iterable[Seen], dead_letters: Iterable[Seen] = ()) -> Verdict:
    """Compare what Kafka holds with the ledger. ``records`` in any order; they are sorted here."""
    verdict = Verdict(committed=len(ledger.committed), rolled_back=len(ledger.rolled_back))
    seen: set[str] = set()
    partitions_of: dict[tuple[str, str | None], set[int]] = {}
    last_seq: dict[tuple[str, str | None], tuple[int, str]] = {}
    for rec in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        verdict.records += 1
        partitions_of.setdefault((rec.topic, rec.key), set()).add(rec.partition)
        if rec.id in seen:
            continue
        seen.add(rec.id)
        expected = ledger.committed.get(rec.id)
        if expected is None:
            (verdict.rolled_back_seen if rec.id in ledger.rolled_back else verdict.unknown).append(rec.id)
            continue
        if (rec.aggregate, rec.seq) != expected or rec.key != expected[0]:
            verdict.mismatched.append(f"{rec.id} at {rec.topic}[{rec.partition}]@{rec.offset}")
            continue
        # First copies of one key, in partition order, must come in commit order.
        where = (rec.topic, rec.key)
        previous = last_seq.get(where)
        if previous is not None and previous[0] >= expected[1]:
            verdict.order_violations.append(
                f"{rec.key} seq {expected[1]} after seq {previous[0]} ({previous[1]}) at "
                f"{rec.topic}[{rec.partition}]@{rec.offset}"
            )
        last_seq[where] = (expected[1], rec.id)
    verdict.distinct = len(seen)
    for rec in dead_letters:  # a dead letter counts as delivered (guarantee 1), and as a violation here
        verdict.dead_letters += 1
        seen.add(rec.id)
    verdict.missing = sorted(set(ledger.committed) - seen)
    verdict.split_keys = sorted(
        f"{topic}/{key} on partitions {sorted(parts)}"
        for (topic, key), parts in partitions_of.items()
        if len(parts) > 1
    )
    return verdict
