"""`python -m tests.bench.soak`: the command line of `make soak` (see the package's docstring)."""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from pathlib import Path

import tests.bench.soak as package
from tests.bench.soak import ROOT
from tests.bench.soak.orchestration import Soak
from tests.children import crash_dumps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.soak", description=package.__doc__.split("\n\n")[0]
    )
    p.add_argument("--minutes", type=float, default=30.0, help="length of the load (default 30)")
    p.add_argument("--rate", type=float, default=20_000.0, help="offered events/s (default 20 000)")
    p.add_argument("--loader-connections", type=int, default=4, help="connections of the load (default 4)")
    p.add_argument("--sample-seconds", type=float, default=2.0, help="between two samples (default 2)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=300.0,
        help="the most the end waits for the backlog (default 300)",
    )
    p.add_argument(
        "--prune-older-than",
        default="2m",
        help="cdc outbox prune --older-than, every minute of the load (default 2m; 0: no pruning)",
    )
    p.add_argument("--seed", type=int, default=1, help="of the transaction sizes (default 1)")
    p.add_argument(
        "--consumer-arg", action="append", default=[], help="one more argument of examples.invoice_service"
    )
    p.add_argument("--output-dir", type=Path, default=ROOT / "bench-results", help="default bench-results/")
    p.add_argument(
        "--inject",
        choices=("missing", "growth"),
        action="append",
        default=[],
        help="to check the soak itself (repeatable): delete 5 processed_events rows before the check "
        "(missing), add 50 MB to cdc run's RSS samples of the last window (growth)",
    )
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0:
        p.error("--minutes and --rate must be positive")
    return args


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    crash_dumps()  # a native crash here or in a child leaves the Python stack of every thread
    signal.signal(signal.SIGTERM, _interrupt)
    soak = Soak(args)
    error = None
    try:
        soak.run()
    except (Exception, KeyboardInterrupt) as exc:
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        soak.failures.append(f"error: {error}")
    finally:
        problems = soak.cleanup()
    if problems:
        soak.result["cleanup_problems"] = problems
        soak.failures.extend(f"clean-up: {p}" for p in problems)
    verdict = soak.judge()
    soak.result["verdict"] = verdict
    soak.result["result"] = "FAIL" if soak.failures else "PASS"
    json_path, png_path = soak.write()
    print(soak.final_line(verdict), flush=True)
    for failure in soak.failures:
        print(f"soak: failed: {failure}", flush=True)
    print(f"soak: results {json_path}" + (f", {png_path}" if png_path else ""), flush=True)
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())
