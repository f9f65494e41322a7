"""The throughput table of a bench result, its human-readable summary, and the verdicts against the
targets (pure)."""

from __future__ import annotations

import statistics
from typing import Any

from tests.bench.profiles import format_top
from tests.bench.table import markdown

RELAYS = ("bare", "cdc", "cdc-eo")
LABELS = {
    "bare": "bare reader (the ceiling: counts Inserts)",
    "cdc": "`cdc run`, at-least-once",
    "cdc-eo": "`cdc run`, exactly-once",
}

TARGETS: dict[str, Any] = {
    "pipeline_events_per_s_min": 50_000,
    "latency_p99_ms_max": 50,
    "latency_offered_events_per_s": 10_000,
    "rss_peak_mb_max": 100,  # issue 15
    "rss_flat_growth_mb_max": "10 MB or 10 % of the peak, from 10 % to 90 % of a phase",
    # Issue 15's targets hold over TCP, the stack's transport, as the issue measured: at least 0.9 of the
    # bulk-reading bare reader and at most 8 µs of CPU per event (at-least-once, librdkafka's threads
    # included). Measured with the compiled hot path, 2026-12-04 on the 2-core VM: `make bench` (1M events)
    # 1.16 and 6.7 µs; `BENCH_ARGS="--events 200000 --repeat 2 --unix-socket"` 0.60 and 8.9 µs (the Unix
    # socket's bare reader reads 176,100 events/s, its walsender spending 5.6 µs per event against 8.6 over
    # TCP; `cdc run` reads that socket less well), so there the targets are those figures' floor.
    "pipeline_to_bare_ratio_min": {"tcp": 0.9, "unix": 0.5},
    "pipeline_cpu_us_per_event_max": {"tcp": 8.0, "unix": 10.0},
    # Issue 13; measured 0.73 over TCP, 0.62 over the Unix socket in those runs.
    "exactly_once_to_at_least_once_min": 0.7,
}


def ratio_target(result: dict[str, Any]) -> float:
    return _by_transport(result, "pipeline_to_bare_ratio_min")


def cpu_target(result: dict[str, Any]) -> float:
    return _by_transport(result, "pipeline_cpu_us_per_event_max")


def _by_transport(result: dict[str, Any], name: str) -> float:
    targets: dict[str, float] = TARGETS[name]
    return targets.get(str(result.get("config", {}).get("transport")), targets["tcp"])


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def throughput(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per relay (the median of its passes; a profiled pass left out when there is another), the
    table of them, and the ratios the verdicts and the summary use."""
    rows = []
    for relay in RELAYS:
        passes = [r for r in runs if r.get("relay") == relay]
        if not passes:
            continue
        counted = [r for r in passes if not r.get("profiled")] or passes
        ok = all(r.get("ok", True) for r in passes)
        peaks = [r["peak_rss_mb"] for r in counted if r.get("peak_rss_mb") is not None]
        rows.append(
            {
                "relay": relay,
                "label": LABELS[relay] + (f" (median of {len(counted)})" if len(counted) > 1 else ""),
                "ok": ok,
                "error": "; ".join(str(r.get("error")) for r in passes if not r.get("ok", True)),
                "events_per_s": _median([r.get("events_per_s") for r in counted]),
                "cpu_us_per_event": _median([r.get("cpu_us_per_event") for r in counted]),
                "walsender_cpu_us_per_event": _median([r.get("walsender_cpu_us_per_event") for r in counted]),
                "peak_rss_mb": max(peaks) if peaks else None,
            }
        )
    rate = {row["relay"]: row["events_per_s"] for row in rows}

    def ratio(a: str, b: str) -> float | None:
        return round(rate[a] / rate[b], 3) if rate.get(a) and rate.get(b) else None

    transports = sorted({str(r["transport"]) for r in runs if r.get("transport")})
    return {
        "rows": rows,
        "table": markdown(rows),
        "transport": ", ".join(transports) or None,
        "bare_events_per_s": rate.get("bare"),
        "pipeline_events_per_s": rate.get("cdc"),
        "pipeline_cpu_us_per_event": next((r["cpu_us_per_event"] for r in rows if r["relay"] == "cdc"), None),
        "exactly_once_events_per_s": rate.get("cdc-eo"),
        "ratio": ratio("cdc", "bare"),
        "exactly_once_to_bare": ratio("cdc-eo", "bare"),
        "exactly_once_to_at_least_once": ratio("cdc-eo", "cdc"),
        "aggregation": "median over repetitions" if len(runs) > len(rows) else "single repetition",
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
    out: dict[str, bool | None] = {
        "throughput": None,
        "latency_p99": None,
        "rss": None,
        "ratio": None,
        "cpu": None,
        "exactly_once_ratio": None,
    }
    if tp.get("pipeline_events_per_s") is not None:
        out["throughput"] = tp["pipeline_events_per_s"] >= TARGETS["pipeline_events_per_s_min"]
    if tp.get("ratio") is not None:
        out["ratio"] = tp["ratio"] >= ratio_target(result)
    if tp.get("pipeline_cpu_us_per_event") is not None:
        out["cpu"] = tp["pipeline_cpu_us_per_event"] <= cpu_target(result)
    if tp.get("exactly_once_to_at_least_once") is not None:
        out["exactly_once_ratio"] = (
            tp["exactly_once_to_at_least_once"] >= TARGETS["exactly_once_to_at_least_once_min"]
        )
    # The pipeline's own commit-to-ack figure when it logged one; else the consumer's upper bound.
    p99 = (lat.get("commit_to_ack") or lat.get("commit_to_consume", {})).get("p99_ms")
    if p99 is not None:
        out["latency_p99"] = p99 <= TARGETS["latency_p99_ms_max"]
    # Peak: VmHWM of every pipeline pass (the kernel's own peak, no sample can miss it); flat: RSS sampled
    # every 0.5 s, from 10 % to 90 % of each pass's arrivals and of the latency phase.
    runs = [r for r in tp.get("runs", []) if r.get("relay") != "bare"]
    peaks = [r["peak_rss_mb"] for r in runs if r.get("peak_rss_mb") is not None]
    sampled = [r["rss"] for r in runs if r.get("rss", {}).get("samples")]
    if lat.get("rss", {}).get("samples"):
        sampled.append(lat["rss"])
        peaks.append(lat["rss"]["peak_mb"])
    if peaks:
        flat = all(abs(r["growth_10_to_90pct_mb"]) <= max(10.0, 0.1 * r["peak_mb"]) for r in sampled)
        out["rss"] = max(peaks) <= TARGETS["rss_peak_mb_max"] and flat
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
    if tp.get("rows"):
        lines += [
            f"THROUGHPUT     each relay drains its own pre-filled slot ({tp.get('aggregation')}), "
            f"PostgreSQL over {cfg.get('transport') or tp.get('transport')}:",
            *tp.get("table", []),
            "               events/s = N / (last arrival - first: LogAppendTime of the records; the bare "
            "reader's own clock at the Inserts it reads); CPU = utime + stime of the relay's process between "
            "the first and the last arrival, per event (its walsender's: all it spent until the last "
            "arrival); peak RSS = VmHWM",
            f"               cdc run >= {TARGETS['pipeline_events_per_s_min']:,} events/s: "
            f"{_flag(v.get('throughput'))}; of bare >= {ratio_target(result)}: "
            f"{_flag(v.get('ratio'))} ({_n(tp.get('ratio'), 2)}); CPU <= {cpu_target(result):g} µs/event: "
            f"{_flag(v.get('cpu'))} ({_n(tp.get('pipeline_cpu_us_per_event'), 1)}); "
            "exactly-once of at-least-once >= "
            f"{TARGETS['exactly_once_to_at_least_once_min']}: {_flag(v.get('exactly_once_ratio'))} "
            f"({_n(tp.get('exactly_once_to_at_least_once'), 2)})",
        ]
    for run in tp.get("runs", []):
        cpu = run.get("machine_cpu", {})
        lines.append(
            f"  {run['relay']} #{run.get('repetition')}: {_n(run.get('events_per_s'))} events/s, "
            f"{_n(run.get('cpu_us_per_event'), 1)} µs/event (walsender "
            f"{_n(run.get('walsender_cpu_us_per_event'), 1)}), VmHWM {_n(run.get('peak_rss_mb'))} MB, "
            f"machine {_n(cpu.get('busy_cores'), 2)} cores busy (steal {_n(cpu.get('steal_cores'), 2)})"
            + (" [PROFILED]" if run.get("profiled") else "")
            + ("" if run.get("ok", True) else f" FAILED: {run.get('error')}")
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
    for row in tp.get("rows", []):
        if row["relay"] != "bare" and row.get("peak_rss_mb") is not None:
            rss_lines.append(f"{row['relay']} throughput: VmHWM {row['peak_rss_mb']:.0f} MB")
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
