"""Top functions of a pipeline profile: cProfile's stats file, or py-spy's raw (collapsed stacks) output."""

from __future__ import annotations

import pstats
import re
from collections import Counter
from pathlib import Path
from typing import Any

_LINE = re.compile(r":\d+\)$")


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.replace(str(Path.cwd()) + "/", "")


def cprofile_top(path: Path, limit: int = 40) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = name if filename == "~" else f"{name} ({_short(filename)}:{line})"
        rows.append(
            {
                "function": where,
                "ncalls": ncalls,
                "tottime_s": round(tottime, 3),
                "cumtime_s": round(cumtime, 3),
            }
        )
    total = stats.total_tt  # type: ignore[attr-defined]
    return {
        "tool": "cProfile",
        "total_seconds": round(total, 3),
        "by_cumulative": sorted(rows, key=lambda r: -r["cumtime_s"])[:limit],
        "by_self": sorted(rows, key=lambda r: -r["tottime_s"])[:limit],
    }


def pyspy_top(path: Path, limit: int = 40) -> dict[str, Any]:
    """py-spy ``--format raw``: one line per distinct stack, ``frame;frame;...;leaf count``."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_LINE.sub(")", f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": n, "pct": round(100 * n / total, 1)}
            for f, n in counter.most_common(limit)
        ]

    return {"tool": "py-spy", "samples": total, "by_cumulative": rows(inclusive), "by_self": rows(own)}


def _from_pipeline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cumulative rows from the pipeline's own frames on: the entry point, click and runpy above them hold
    everything and say nothing."""
    first = next((i for i, r in enumerate(rows) if "cdc/stream/" in r["function"]), 0)
    return rows[first:]


def format_top(profile: dict[str, Any], limit: int = 15) -> list[str]:
    lines = []
    if profile["tool"] == "cProfile":
        lines.append(f"cProfile, {profile['total_seconds']} s of profiled time; top by cumulative time:")
        for r in _from_pipeline(profile["by_cumulative"])[:limit]:
            lines.append(
                f"  {r['cumtime_s']:8.2f} s cum {r['tottime_s']:8.2f} s self {r['ncalls']:>9} {r['function']}"
            )
        lines.append("top by self time:")
        for r in profile["by_self"][:limit]:
            lines.append(
                f"  {r['tottime_s']:8.2f} s self {r['cumtime_s']:8.2f} s cum {r['ncalls']:>9} {r['function']}"
            )
    else:
        lines.append(
            f"py-spy (wall clock, idle included), {profile['samples']} samples; top by inclusive share:"
        )
        for r in _from_pipeline(profile["by_cumulative"])[:limit]:
            lines.append(f"  {r['pct']:5.1f} %  {r['function']}")
        lines.append("top by self share (time in C extensions counts for the Python frame that called them):")
        for r in profile["by_self"][:limit]:
            lines.append(f"  {r['pct']:5.1f} %  {r['function']}")
    return lines
