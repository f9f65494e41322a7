"""How `cdc audit` reports (:mod:`cdc.ops.audit`): a table for a terminal, JSON with every missing id
(streamed from the server's cursor, the counts first), and a Prometheus textfile (``--metrics-file``, for
node_exporter's textfile collector and the rules in deploy/prometheus/outbox-cdc-audit.yml).

The textfile is written whole (a temporary file renamed over it), so a collector never reads half of it. Every
run writes ``cdc_audit_result`` (0 nothing missing, 1 missing events, 2 refused, 3 failed) and the run's time;
a run that judged its window adds the counts per aggregate type and state.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, TextIO

from cdc.ops.audit import STATES, AuditReport

COLUMNS: Final = ("expected", *STATES, "duplicates")


def summary(report: AuditReport) -> dict[str, Any]:
    """Everything of the JSON report but the missing ids."""
    window = report.window
    return {
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "acknowledged": window.acknowledged.isoformat(),
        "by_commit_timestamp": window.by_commit,
        "topics": report.topics,
        "aggregates": {k: vars(v) for k, v in sorted(report.aggregates.items())},
        "missing": report.missing,
        "without_row": report.without_row,
        "carried": report.carried,
        "audited_until": None if report.audited_until is None else report.audited_until.isoformat(),
    }


def write_json(report: AuditReport, missing_ids: Iterable[str], out: TextIO) -> None:
    """The JSON report, streamed: the counts first, then ``missing_ids`` (last) as they come, a batch of
    lines per write, so that its memory is the same for ten missing events and ten million."""
    head = json.dumps(summary(report), indent=2)
    out.write(head[: head.rindex("}")].rstrip() + ',\n  "missing_ids": [')
    batch: list[str] = []
    first = True
    for event_id in missing_ids:
        batch.append(_quoted(event_id))
        if len(batch) >= WRITE_BATCH:
            out.write(("\n    " if first else ",\n    ") + ",\n    ".join(batch))
            batch, first = [], False
    if batch:
        out.write(("\n    " if first else ",\n    ") + ",\n    ".join(batch))
        first = False
    out.write("]\n}\n" if first else "\n  ]\n}\n")


WRITE_BATCH: Final = 10_000
_quoted: Callable[[str], str] = json.encoder.encode_basestring_ascii  # json.dumps of a str, in C


def as_table(report: AuditReport) -> list[str]:
    window = report.window
    lines = [
        f"window {window.since.isoformat(timespec='seconds')} .. {window.until.isoformat(timespec='seconds')}"
        f" (rows by {'commit timestamp' if window.by_commit else 'created_at'})",
        f"{'AGGREGATE TYPE':<24}" + "".join(f"{c.upper().replace('_', ' '):>14}" for c in COLUMNS),
    ]
    for name, counts in sorted(report.aggregates.items()):
        lines.append(f"{name:<24}" + "".join(f"{getattr(counts, c):>14}" for c in COLUMNS))
    if report.without_row:
        lines.append(
            f"{report.without_row} records of the window have no row: events emitted as logical messages "
            "(outbox_emit_message) leave none, and the audit cannot check them"
        )
    if report.carried:
        lines.append(
            f"{report.carried} rows created before the window are judged too: their transactions were open "
            "during the last clean audit, which could not see them"
        )
    if report.missing_ids:
        more = report.missing - len(report.missing_ids)
        lines.append(
            f"missing: {', '.join(report.missing_ids)}" + (f" and {more} more (--json)" if more else "")
        )
    if report.audited_until is not None:
        lines.append(
            f"audited until {report.audited_until.isoformat(timespec='seconds')} (cdc outbox prune --audited)"
        )
    return lines


CLEAN: Final = 0
MISSING: Final = 1
REFUSED: Final = 2
FAILED: Final = 3


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(slot: str, result: int, now: float, report: AuditReport | None = None) -> str:
    s = f'slot="{_label(slot)}"'
    lines = [
        "# HELP cdc_audit_result The last audit's verdict: 0 nothing missing, 1 missing events, 2 refused, "
        "3 failed.",
        "# TYPE cdc_audit_result gauge",
        f"cdc_audit_result{{{s}}} {result}",
        "# HELP cdc_audit_last_run_timestamp_seconds When the last audit ran.",
        "# TYPE cdc_audit_last_run_timestamp_seconds gauge",
        f"cdc_audit_last_run_timestamp_seconds{{{s}}} {now:.3f}",
    ]
    if report is None:
        return "\n".join(lines) + "\n"
    lines += [
        "# HELP cdc_audit_window_end_timestamp_seconds The end of the last judged window.",
        "# TYPE cdc_audit_window_end_timestamp_seconds gauge",
        f"cdc_audit_window_end_timestamp_seconds{{{s}}} {report.window.until.timestamp():.3f}",
        "# HELP cdc_audit_events The window's outbox rows by aggregate type and what became of them.",
        "# TYPE cdc_audit_events gauge",
    ]
    for name, counts in sorted(report.aggregates.items()):
        for state in STATES:
            lines.append(
                f'cdc_audit_events{{{s},aggregate_type="{_label(name)}",state="{state}"}} '
                f"{getattr(counts, state)}"
            )
    lines += [
        "# HELP cdc_audit_missing_events Committed events of the window neither published nor dead-lettered.",
        "# TYPE cdc_audit_missing_events gauge",
        f"cdc_audit_missing_events{{{s}}} {report.missing}",
        "# HELP cdc_audit_duplicates Copies of the window's events beyond the first in their topics.",
        "# TYPE cdc_audit_duplicates gauge",
        f"cdc_audit_duplicates{{{s}}} {sum(c.duplicates for c in report.aggregates.values())}",
    ]
    return "\n".join(lines) + "\n"


def write_metrics_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
