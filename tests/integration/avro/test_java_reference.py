"""`cdc schemas check` gives Apache Avro's verdict: a differential test against the Java library.

Thousands of generated (old, new) pairs (tests/integration/avro/pairs.py) go, as ``Event/v1.avsc`` and
``Event/v2.avsc``, through :func:`cdc.avro.catalog.check_schemas` (what the command runs) and, in one JVM,
through ``Schema.Parser`` and ``SchemaCompatibility.checkReaderWriterCompatibility`` of
``org.apache.avro:avro`` (stack/avro-reference). In BACKWARD, FORWARD and FULL the verdicts must be the same:
invalid (either schema refused), compatible or incompatible. Where the project departs from Java on purpose
(docs/schema-checks.md), the pair says so and the project's verdict is the documented one, and Java's still
differs (else the table is out of date). Every disagreement is printed with both schemas.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cdc.avro.catalog import check_schemas
from tests.integration.avro.pairs import Pair, generate
from tests.plugins.avro_reference import Verdicts

PAIRS = 2400
MODES = ("BACKWARD", "FORWARD", "FULL")


def java_verdicts(v: dict[str, Any]) -> dict[str, str]:
    if v["old"] is not None or v["new"] is not None:
        return dict.fromkeys(MODES, "invalid")
    # A check that throws (a reader field whose aliases match two writer fields) cannot pass.
    back, fwd = (v[d] == "compatible" for d in ("backward", "forward"))
    verdict = {True: "compatible", False: "incompatible"}
    return {"BACKWARD": verdict[back], "FORWARD": verdict[fwd], "FULL": verdict[back and fwd]}


def our_verdicts(pair: Pair, old: str, new: str, root: Path) -> tuple[dict[str, str], list[str]]:
    schemas = root / pair.id
    (schemas / "Event").mkdir(parents=True)
    (schemas / "Event" / "v1.avsc").write_text(old)
    (schemas / "Event" / "v2.avsc").write_text(new)
    report = check_schemas(schemas, "FULL")
    if len(report.problems) > len(report.violations):
        return dict.fromkeys(MODES, "invalid"), report.problems
    back = not any(v.direction == "backward" for v in report.violations)
    fwd = not any(v.direction == "forward" for v in report.violations)
    verdict = {True: "compatible", False: "incompatible"}
    return {
        "BACKWARD": verdict[back],
        "FORWARD": verdict[fwd],
        "FULL": verdict[back and fwd],
    }, report.problems


def test_schemas_check_agrees_with_apache_avro_java(avro_reference: Verdicts, tmp_path: Path) -> None:
    started = time.monotonic()
    pairs = generate(PAIRS)
    texts = {p.id: (json.dumps(p.old), json.dumps(p.new)) for p in pairs}
    java = avro_reference([(p.id, *texts[p.id]) for p in pairs])
    java_done = time.monotonic()
    disagreements: list[str] = []
    seen: Counter[str] = Counter()
    for p in pairs:
        theirs = java_verdicts(java[p.id])
        ours, problems = our_verdicts(p, *texts[p.id], tmp_path)
        seen.update(ours.values())
        if p.departure:
            wrong = ours != dict.fromkeys(MODES, p.expect) or ours == theirs
        else:
            wrong = ours != theirs
        if wrong:
            why = (
                f"departure {p.departure!r}: ours should be {p.expect} and Java's differ; "
                if p.departure
                else ""
            )
            disagreements.append(
                f"{p.id}: {why}ours {ours}, Java {theirs}\n"
                f"  old: {texts[p.id][0]}\n  new: {texts[p.id][1]}\n"
                f"  Java: old {java[p.id]['old']}, new {java[p.id]['new']}, "
                f"backward {java[p.id]['backward']}, forward {java[p.id]['forward']}\n"
                f"  ours: {problems}"
            )
    print(
        f"{len(pairs)} pairs, {len(disagreements)} disagreements; verdicts {dict(seen)}; "
        f"Java {java_done - started:.1f} s, ours {time.monotonic() - java_done:.1f} s"
    )
    for line in disagreements:
        print(line)
    assert not disagreements, f"{len(disagreements)} of {len(pairs)} pairs disagree with Apache Avro (above)"
    # The generator must keep making every kind of verdict, or the agreement proves little.
    assert min(seen[v] for v in ("invalid", "compatible", "incompatible")) >= PAIRS // 10, seen
