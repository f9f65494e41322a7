"""The figures of one relay's drain, the markdown table of all of them, and the report around it (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figures(
    *,
    events: int,
    first_ms: int,
    last_ms: int,
    relay_cpu_s: float | None,
    walsender_cpu_s: float | None,
    window_events: int,
) -> dict[str, Any]:
    """Rate over the arrival span. The relay's CPU per event is over the events that arrived while it was
    counted (``window_events``: between the poll that saw the first record and the one that saw the last,
    so that start-up is left out); the walsender's (``walsender_cpu_s``: all it spent, from its start to
    the last record, as it decodes ahead of the first arrival) per event of the ``events``."""
    span = (last_ms - first_ms) / 1000
    out: dict[str, Any] = {
        "arrival_span_s": round(span, 3),
        "events_per_s": round(events / span) if span > 0 else None,
    }
    # No event arrived between the two polls (a drain shorter than one poll): no figure rather than 0.
    counted = relay_cpu_s is not None and window_events > 0
    out["cpu_us_per_event"] = round(relay_cpu_s / window_events * 1e6, 1) if counted else None
    out["walsender_cpu_us_per_event"] = (
        None if walsender_cpu_s is None else round(walsender_cpu_s / events * 1e6, 1)
    )
    return out


def _rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{round(value, -2):,.0f}" if value >= 1000 else f"{value:,.0f}"


def _rss(mb: float | None) -> str:
    if mb is None:
        return "-"
    return f"{mb / 1024:.2f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def _cpu(run: dict[str, Any]) -> str:
    relay, wal = run.get("cpu_us_per_event"), run.get("walsender_cpu_us_per_event")
    text = "n/a" if relay is None else f"{relay:.1f}"
    if wal is not None:
        text += f" (walsender {wal:.1f})"
    return text


def markdown(runs: list[dict[str, Any]]) -> list[str]:
    """The table of the issue: one row per relay, rate relative to the bare reader's when it ran."""
    bare = next((r.get("events_per_s") for r in runs if r.get("relay") == "bare"), None)
    lines = [
        "| relay | events/s | vs bare drain | CPU µs/event | peak RSS |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        rate = run.get("events_per_s")
        ratio = f"{rate / bare:.2f}" if rate and bare else "n/a"
        label = run["label"] if run.get("ok", True) else f"{run['label']} (FAILED: {run.get('error', '?')})"
        lines.append(f"| {label} | {_rate(rate)} | {ratio} | {_cpu(run)} | {_rss(run.get('peak_rss_mb'))} |")
    return lines


def report(result: dict[str, Any], output: Path) -> str:
    m = result.get("machine", {})
    cfg = result.get("config", {})
    lines = [
        f"bench-debezium, run {result.get('run_id')} ({result.get('started_at')}): "
        f"{cfg.get('events', 0):,} outbox inserts in {cfg.get('rows_per_txn')}-row transactions, "
        f"{cfg.get('partitions')} partitions; {m.get('nproc')} CPUs, PostgreSQL {m.get('postgres')}, "
        f"load average {m.get('loadavg_at_start')} at the start, {result.get('loadavg_at_end')} at the end",
        "",
        *result.get("table", []),
        "",
        "events/s = N / (LogAppendTime of the last record - of the first); CPU = utime+stime of the relay "
        "between the polls that saw the first and the last record, per event arrived in between; its "
        "walsender's from its start to the last record, per event",
    ]
    for run in result.get("runs", []):
        sample = run.get("sample_record")
        if sample:
            lines.append(
                f"{run['relay']}: {run.get('records', 0):,} records, "
                f"{run.get('distinct_event_ids', 0):,} distinct event ids; a record: key {sample['key']!r}, "
                f"{sample['value_format']} ({sample['value_bytes']} B"
                + (f", schema id {sample['schema_id']}" if "schema_id" in sample else "")
                + (
                    f", fields {', '.join(sample['decoded_fields'])}"
                    if isinstance(sample.get("decoded_fields"), list)
                    else ""
                )
                + f"), headers {', '.join(sample['headers'])}"
            )
    if result.get("error"):
        lines.append(f"ERROR: {result['error']}")
    for problem in result.get("cleanup_problems", []):
        lines.append(f"clean-up problem: {problem}")
    lines.append(f"results: {output}")
    return "\n".join(lines)
