"""The human-readable summary of a bench result, and the verdicts against the targets."""

from __future__ import annotations

from typing import Any

from tests.bench.profiles import format_top

TARGETS: dict[str, Any] = {
    "pipeline_events_per_s_min": 50_000,
    "latency_p99_ms_max": 50,
    "latency_offered_events_per_s": 10_000,
    "rss_peak_mb_max": 200,
    "rss_flat_growth_mb_max": "10 MB or 10 % of the peak, from 10 % to 90 % of a phase",
    "pipeline_to_bare_ratio_min": 0.5,
}


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _flag(ok: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[ok]


def verdicts(result: dict[str, Any]) -> dict[str, bool | None]:
    tp = result.get("throughput", {})
    lat = result.get("latency", {})
    out: dict[str, bool | None] = {"throughput": None, "latency_p99": None, "rss": None, "ratio": None}
    if tp.get("pipeline_events_per_s") is not None:
        out["throughput"] = tp["pipeline_events_per_s"] >= TARGETS["pipeline_events_per_s_min"]
    if tp.get("ratio") is not None:
        out["ratio"] = tp["ratio"] >= TARGETS["pipeline_to_bare_ratio_min"]
    # The pipeline's own commit-to-ack figure when it logged one; else the consumer's upper bound.
    p99 = (lat.get("commit_to_ack") or lat.get("commit_to_consume", {})).get("p99_ms")
    if p99 is not None:
        out["latency_p99"] = p99 <= TARGETS["latency_p99_ms_max"]
    rss = [r["rss"] for r in tp.get("pipeline_runs", []) if r.get("rss", {}).get("samples")]
    if lat.get("rss", {}).get("samples"):
        rss.append(lat["rss"])
    if rss:
        peak = max(r["peak_mb"] for r in rss)
        flat = all(abs(r["growth_10_to_90pct_mb"]) <= max(10.0, 0.1 * r["peak_mb"]) for r in rss)
        out["rss"] = peak <= TARGETS["rss_peak_mb_max"] and flat
    return out


def summary(result: dict[str, Any]) -> list[str]:
    m = result.get("machine", {})
    cfg = result.get("config", {})
    fill = result.get("fill", {})
    tp = result.get("throughput", {})
    lat = result.get("latency", {})
    v = result.get("verdicts", {})
    lines = [
        f"outbox CDC benchmark, run {result.get('run_id')} ({result.get('started_at')})",
        f"machine        {m.get('nproc')} CPUs ({m.get('cpu_model')}), Python {m.get('python')}, "
        f"PostgreSQL {m.get('postgres')}, librdkafka {m.get('librdkafka')}, "
        f"load avg {m.get('loadavg_at_start')}",
        f"events         {_n(cfg.get('events'))} in transactions of {cfg.get('rows_per_txn')} "
        f"(avg payload {_n(fill.get('avg_payload_bytes'))} B, {cfg.get('aggregates')} aggregates, "
        f"{cfg.get('partitions')} partitions)",
    ]
    if fill:
        lines.append(
            f"fill           {fill['seconds']:.1f} s ({_n(fill['events_per_s'])} events/s inserted), "
            f"WAL {fill['wal_bytes'] / 2**20:,.0f} MiB"
        )
    for run in tp.get("pipeline_runs", []):
        lines.append(
            f"pipeline #{run['repetition']}    {run['seconds']:.2f} s -> {_n(run['events_per_s'])} events/s "
            f"(from slot active: {run['streaming_seconds']:.2f} s -> {_n(run['streaming_events_per_s'])}/s; "
            f"10-90 % of WAL: {_n(run.get('steady_events_per_s'))}/s)"
            + (" [PROFILED]" if run.get("profiled") else "")
        )
        cpu = run.get("cpu_cores", {})
        lines.append(
            f"               CPU cores busy: pipeline {_n(cpu.get('pipeline'), 2)}, walsender "
            f"{_n(cpu.get('walsender'), 2)}, kafka {_n(cpu.get('kafka'), 2)}, machine "
            f"{_n(cpu.get('busy_cores'), 2)} (steal {_n(cpu.get('steal_cores'), 2)}); "
            f"exit {run['stop']['exit_code']} after SIGTERM in {run['stop']['stop_seconds']} s"
        )
    for run in tp.get("exactly_once_runs", []):
        lines.append(
            f"exactly-once #{run['repetition']} {run['seconds']:.2f} s -> "
            f"{_n(run['events_per_s'])} events/s, "
            f"{_n(run.get('cpu_us_per_event'), 1)} CPU µs/event; exit {run['stop']['exit_code']}"
        )
    for run in tp.get("bare_runs", []):
        lines.append(
            f"bare reader #{run['repetition']} {run['seconds']:.2f} s -> {_n(run['events_per_s'])} events/s "
            f"(streaming: {_n(run['streaming_events_per_s'])}/s; walsender "
            f"{_n(run.get('walsender_cpu_seconds'), 1)} CPU s, "
            f"reader {_n(run.get('reader_cpu_seconds'), 1)} CPU s, machine "
            f"{_n(run.get('cpu_cores', {}).get('busy_cores'), 2)} cores busy)"
        )
    if tp:
        lines += [
            f"THROUGHPUT     pipeline {_n(tp.get('pipeline_events_per_s'))} events/s, bare reader "
            f"{_n(tp.get('bare_events_per_s'))} events/s, ratio {_n(tp.get('ratio'), 2)} "
            f"(from slot active: {_n(tp.get('ratio_streaming'), 2)})",
            f"               target >= {TARGETS['pipeline_events_per_s_min']:,} events/s: "
            f"{_flag(v.get('throughput'))}; ratio >= {TARGETS['pipeline_to_bare_ratio_min']}: "
            f"{_flag(v.get('ratio'))}",
        ]
    if tp.get("exactly_once_events_per_s"):
        lines.append(
            f"EXACTLY-ONCE   {_n(tp['exactly_once_events_per_s'])} events/s, "
            f"{_n(tp['exactly_once_to_at_least_once'], 2)} of at-least-once (target >= 0.7); CPU "
            f"{_n(tp.get('exactly_once_cpu_us_per_event'), 1)} vs "
            f"{_n(tp.get('cpu_us_per_event'), 1)} µs/event"
        )
    eo_lat = result.get("latency_exactly_once", {})
    if eo_lat:
        c = eo_lat.get("commit_to_consume", {})
        lines.append(
            f"LATENCY (EO)   commit-to-consume p50 {c.get('p50_ms')} ms, p99 {c.get('p99_ms')} ms, "
            f"max {c.get('max_ms')} ms (read_committed: a record is visible once its transaction commits)"
        )
    if lat:
        c = lat.get("commit_to_consume", {})
        ack = lat.get("commit_to_ack", {})
        offered = lat.get("offered", {})
        lcpu = lat.get("cpu_cores", {})
        lines += [
            f"LATENCY        at {_n(offered.get('achieved_events_per_s'))} events/s achieved "
            f"(target {_n(offered.get('target_events_per_s'))}/s, {offered.get('seconds')} s, "
            f"{_n(offered.get('events'))} events): commit-to-consume p50 {c.get('p50_ms')} ms, "
            f"p99 {c.get('p99_ms')} ms, max {c.get('max_ms')} ms (an upper bound of commit-to-ack)",
            f"               commit-to-ack measured by the pipeline: p50 {ack.get('p50_ms')} ms, "
            f"p99 {ack.get('p99_ms')} ms, max {ack.get('max_ms')} ms over {_n(ack.get('count'))} events",
            f"               {_n(c.get('count'))} records received; CPU cores busy: pipeline "
            f"{_n(lcpu.get('pipeline'), 2)}, walsender {_n(lcpu.get('walsender'), 2)}, kafka "
            f"{_n(lcpu.get('kafka'), 2)}, machine {_n(lcpu.get('busy_cores'), 2)} of {m.get('nproc')} "
            f"(steal {_n(lcpu.get('steal_cores'), 2)})",
            f"               p99 <= {TARGETS['latency_p99_ms_max']} ms: {_flag(v.get('latency_p99'))}",
        ]
        seconds = lat.get("per_second", [])
        if seconds:
            trend = ", ".join(
                f"{b['second']}s {b['p50_ms']:.0f}" for b in seconds[:: max(1, len(seconds) // 6)]
            )
            lines.append(
                f"               p50 by second of receipt (ms): {trend}; all received "
                f"{lat.get('all_received_after_load_s')} s after the load ended"
            )
    rss_lines = []
    for run in tp.get("pipeline_runs", []):
        r = run.get("rss", {})
        if r.get("samples"):
            rss_lines.append(
                f"throughput #{run['repetition']}: peak {r['peak_mb']} MB, 10/50/90 % "
                f"{r['at_10pct_mb']}/{r['at_50pct_mb']}/{r['at_90pct_mb']} MB"
            )
    r = lat.get("rss", {})
    if r.get("samples"):
        rss_lines.append(
            f"latency phase: peak {r['peak_mb']} MB, 10/50/90 % {r['at_10pct_mb']}/{r['at_50pct_mb']}/"
            f"{r['at_90pct_mb']} MB"
        )
    if rss_lines:
        lines.append("RSS            " + "; ".join(rss_lines))
        lines.append(
            f"               peak <= {TARGETS['rss_peak_mb_max']} MB and flat: {_flag(v.get('rss'))}"
        )
    kafka = result.get("kafka_check")
    if kafka:
        lines.append(
            f"kafka check    {_n(kafka['records'])} records in the topic (expected {_n(kafka['expected'])}), "
            f"{kafka['dlq_records']} in the DLQ"
        )
    if result.get("profile"):
        lines += format_top(result["profile"])
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    if result.get("error"):
        lines.append(f"ERROR: {result['error']}")
    if result.get("output"):
        lines.append(f"results        {result['output']}")
    return lines
