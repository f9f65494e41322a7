"""The soak's outputs: the JSON of every sample and minute, and the plot (matplotlib, a dev extra) of RSS
and p50/p99 per minute, in bench-results/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tests.bench.soak import progress
from tests.bench.soak.judgement import P99_LIMIT_MS


class Output:
    """Writes the result (a base of Soak: its base path, minutes, samples, failures and result are set by
    Soak)."""

    def write(self) -> tuple[Path, Path | None]:
        self.result["minutes"] = self.minutes
        self.result["samples"] = self.samples
        self.result["failures"] = self.failures
        json_path = self.base.with_suffix(".json")
        json_path.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        png_path: Path | None = self.base.with_suffix(".png")
        try:
            plot(self.result, png_path)  # type: ignore[arg-type]
        except Exception as exc:  # the figures stand without the picture
            progress(f"no plot: {type(exc).__name__}: {exc}")
            png_path = None
        return json_path, png_path


def plot(result: dict[str, Any], path: Path) -> None:
    """Two panels over the minutes of the run: RSS of both processes, commit-to-consume p50/p99 per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, minutes = result["samples"], result["minutes"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    t = [s["t"] / 60 for s in samples]
    for key, label in (("rss_run_mb", "cdc run"), ("rss_consumer_mb", "invoice consumer")):
        top.plot(t, [s[key] for s in samples], label=label)
    top.set_ylabel("RSS (MB)")
    top.set_ylim(bottom=0)
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    edges = [0.0]
    for m in minutes:
        edges.append(edges[-1] + m["seconds"] / 60)

    def values(key: str) -> list[float]:
        return [math.nan if m[key] is None else m[key] for m in minutes]

    if minutes:
        bottom.stairs(
            values("p99_ms"), edges, label="p99 per minute", color="tab:red", linewidth=2, baseline=None
        )
        bottom.stairs(
            values("p50_ms"), edges, label="p50 per minute", color="tab:blue", linewidth=2, baseline=None
        )
    middles = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
    explained = [(x, m) for x, m in zip(middles, minutes, strict=True) if m["checkpoint"] or m["vacuum"]]
    bottom.scatter(
        [x for x, _ in explained],
        [m["p99_ms"] or 0 for _, m in explained],
        marker="x",
        color="black",
        label="checkpoint or vacuum in the minute",
        zorder=3,
    )
    bottom.axhline(P99_LIMIT_MS, color="grey", linestyle="--", label=f"{P99_LIMIT_MS:g} ms")
    bottom.set_ylabel("commit-to-consume (ms)")
    bottom.set_xlabel("minutes since the load started")
    highest = max((m["p99_ms"] for m in minutes if m["p99_ms"] is not None), default=0)
    bottom.set_ylim(0, max(highest, P99_LIMIT_MS) * 1.35)  # room for the legend above the lines
    bottom.legend(loc="upper left", fontsize="small", ncol=4)
    bottom.grid(alpha=0.3)
    config = result["config"]
    fig.suptitle(
        f"make soak {result['started_at']}: {config['rate']:,.0f} events/s offered for "
        f"{config['minutes']:g} min, {result.get('result')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
