"""The command line of `make bench-debezium`: arguments, signals, the run, the clean-up, the report."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from tests.bench.debezium.bench import RELAYS, BenchError, DebeziumBench, short_error
from tests.bench.debezium.table import report
from tests.bench.table import markdown
from tests.children import crash_dumps


def default_connect_port(environ: dict[str, str]) -> int:
    """Kafka Connect's REST port: CDC_BENCH_CONNECT_PORT, else the stack's Kafka port + 3 (beside its
    controller's, + 1; below 32768 like every port of the stack)."""
    if environ.get("CDC_BENCH_CONNECT_PORT"):
        return int(environ["CDC_BENCH_CONNECT_PORT"])
    bootstrap = environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29092")
    return int(bootstrap.split(",")[0].rsplit(":", 1)[1]) + 3


def parse_relays(text: str) -> list[str]:
    relays = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in relays if r not in RELAYS]
    if unknown or not relays:
        raise argparse.ArgumentTypeError(f"relays are a comma-separated choice of {', '.join(RELAYS)}")
    return relays


def parse_args(argv: list[str] | None, environ: dict[str, str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.debezium",
        description="cdc run beside Debezium (Kafka Connect standalone + Outbox Event Router) on one stack",
    )
    p.add_argument("--events", type=int, default=500_000, help="outbox rows to drain (default 500 000)")
    p.add_argument("--rows-per-txn", type=int, default=100, help="rows per transaction (default 100)")
    p.add_argument("--aggregates", type=int, default=500, help="distinct aggregate ids (default 500)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of every relay's topic (default 6)")
    p.add_argument(
        "--relays",
        type=parse_relays,
        default=list(RELAYS),
        help=f"which relays drain, in this order (default all: {','.join(RELAYS)})",
    )
    p.add_argument(
        "--value-format",
        choices=("single-object", "confluent"),
        default="single-object",
        help="cdc run's Avro framing; confluent registers in CDC_SCHEMA_REGISTRY_URL (default single-object)",
    )
    p.add_argument("--database", default="cdc_bench_debezium", help="bench database, dropped and re-created")
    p.add_argument(
        "--connect-port",
        type=int,
        default=default_connect_port(environ),
        help="Kafka Connect's REST port on 127.0.0.1 (default CDC_BENCH_CONNECT_PORT, else Kafka's port + 3)",
    )
    p.add_argument(
        "--start-timeout", type=float, default=300, help="s from a relay's start to its first record"
    )
    p.add_argument("--output", type=Path, help="JSON file (default bench-results/bench-debezium-<time>.json)")
    args = p.parse_args(argv)
    if args.events <= 0 or args.events % args.rows_per_txn:
        p.error(f"--events must be a positive multiple of --rows-per-txn ({args.rows_per_txn})")
    if not 0 < args.connect_port < 32768:
        p.error("--connect-port must be below 32768 (outside Linux's ephemeral range)")
    return args


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    crash_dumps()
    environ = dict(os.environ)
    args = parse_args(argv, environ)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        bench = DebeziumBench(args, environ)
    except BenchError as exc:
        print(f"bench-debezium: {exc}", file=sys.stderr)
        return 2
    code = 0
    try:
        bench.run()
    except (Exception, KeyboardInterrupt) as exc:
        code = 1
        bench.result["error"] = short_error(exc)
        if not isinstance(exc, BenchError):
            traceback.print_exc()
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        problems = bench.cleanup()
        if problems:
            bench.result["cleanup_problems"] = problems
            code = code or 1
    bench.result["runs"] = bench.runs
    bench.result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    bench.result["table"] = markdown(bench.runs)
    bench.output.write_text(json.dumps(bench.result, indent=2) + "\n")
    print(report(bench.result, bench.output))
    return code
