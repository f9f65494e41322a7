"""The report of `make bench-debezium` around the table of ``tests.bench.table`` (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
