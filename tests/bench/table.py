"""The figures of one relay's drain and the table of all of them, the same for `make bench` and
`make bench-debezium` (pure)."""

from __future__ import annotations

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
