"""The pure parts of `make bench`: the throughput table and its ratios, the verdicts, the summary, the
transport, and the arguments."""

from __future__ import annotations

from tests.bench.db import transport, with_host
from tests.bench.report import summary, throughput, verdicts
from tests.bench.run import parse_args


def run(relay: str, rep: int, rate: int, cpu: float, wal: float, rss: float | None, **extra: object) -> dict:
    return {
        "relay": relay,
        "repetition": rep,
        "ok": True,
        "events_per_s": rate,
        "cpu_us_per_event": cpu,
        "walsender_cpu_us_per_event": wal,
        "peak_rss_mb": rss,
        **extra,
    }


RUNS = [
    run("bare", 0, 150_000, 1.6, 6.0, 30.0, transport="tcp"),
    run("cdc", 0, 60_000, 15.0, 6.5, 70.0),
    run("cdc-eo", 0, 45_000, 16.0, 6.4, 80.0),
    run("cdc-eo", 1, 48_000, 15.0, 6.2, 75.0),
    run("cdc", 1, 66_000, 14.0, 6.1, 72.0),
    run("bare", 1, 130_000, 1.8, 6.2, 30.5, transport="tcp"),
]


def test_each_relay_is_the_median_of_its_passes_and_every_rate_is_related_to_the_bare_reader():
    tp = throughput(RUNS)
    rows = {row["relay"]: row for row in tp["rows"]}
    assert [row["relay"] for row in tp["rows"]] == ["bare", "cdc", "cdc-eo"]
    assert rows["bare"]["events_per_s"] == 140_000
    assert rows["cdc"]["events_per_s"] == 63_000
    assert rows["cdc-eo"]["cpu_us_per_event"] == 15.5
    assert rows["cdc"]["peak_rss_mb"] == 72.0  # the highest VmHWM, not a median
    assert tp["ratio"] == 0.45
    assert tp["exactly_once_to_bare"] == round(46_500 / 140_000, 3)
    assert tp["exactly_once_to_at_least_once"] == round(46_500 / 63_000, 3)
    assert tp["transport"] == "tcp"
    assert tp["aggregation"] == "median over repetitions"
    assert tp["table"][0] == "| relay | events/s | vs bare drain | CPU µs/event | peak RSS |"
    assert (
        tp["table"][3]
        == "| `cdc run`, at-least-once (median of 2) | 63,000 | 0.45 | 14.5 (walsender 6.3) | 72 MB |"
    )


def test_a_profiled_pass_is_left_out_when_there_is_another():
    runs = [run("bare", 0, 100_000, 2, 6, None), run("cdc", 0, 10_000, 90, 6, 80, profiled=True)]
    assert throughput(runs)["pipeline_events_per_s"] == 10_000  # the only one: kept
    runs.append(run("cdc", 1, 50_000, 15, 6, 70))
    assert throughput(runs)["pipeline_events_per_s"] == 50_000


def test_a_failed_pass_fails_its_row_and_without_a_relay_there_is_no_ratio():
    runs = [run("cdc", 0, 50_000, 15, 6, 70, ok=False, error="9 distinct events of 10")]
    tp = throughput(runs)
    assert tp["rows"][0]["ok"] is False
    assert "FAILED: 9 distinct events of 10" in tp["table"][2]
    assert tp["ratio"] is None and tp["exactly_once_to_at_least_once"] is None
    assert tp["aggregation"] == "single repetition"


def test_verdicts_take_vmhwm_as_the_peak_and_the_exactly_once_ratio_from_issue_13():
    tp = throughput(RUNS)
    flat = {"samples": 10, "peak_mb": 70.0, "growth_10_to_90pct_mb": 2.0}
    result = {"throughput": {"runs": [dict(r, rss=flat) for r in RUNS], **tp}}
    v = verdicts(result)
    assert v["throughput"] is True  # 63,000 >= 50,000
    assert v["ratio"] is False  # 0.45 < 0.9 over TCP, the default
    assert v["cpu"] is False  # the median 14.5 µs > 8 over TCP
    result["config"] = {"transport": "unix"}
    assert verdicts(result)["ratio"] is False  # < 0.5 over the Unix socket
    fast = [dict(r, cpu_us_per_event=7.0, events_per_s=140_000) if r["relay"] == "cdc" else r for r in RUNS]
    quick = verdicts({"throughput": {"runs": fast, **throughput(fast)}})
    assert quick["ratio"] is True and quick["cpu"] is True  # 1.0 of bare, 7 µs
    assert v["exactly_once_ratio"] is True  # 0.738
    assert v["rss"] is True
    heavy = [dict(r, peak_rss_mb=250.0) if r["relay"] == "cdc-eo" else r for r in RUNS]
    assert verdicts({"throughput": {"runs": heavy, **throughput(heavy)}})["rss"] is False
    grows = [dict(r, rss={"samples": 9, "peak_mb": 90.0, "growth_10_to_90pct_mb": 30.0}) for r in RUNS]
    assert verdicts({"throughput": {"runs": grows, **throughput(grows)}})["rss"] is False


def test_the_summary_shows_the_table_the_transport_and_every_pass():
    result = {
        "config": {"transport": "unix", "events": 200_000},
        "throughput": {"runs": RUNS, **throughput(RUNS)},
    }
    result["verdicts"] = verdicts(result)
    text = "\n".join(summary(result))
    assert "PostgreSQL over unix" in text
    assert "| bare reader (the ceiling: counts Inserts) (median of 2) | 140,000 | 1.00 |" in text
    assert "  cdc-eo #1: 48,000 events/s, 15.0 µs/event (walsender 6.2), VmHWM 75 MB" in text
    assert "exactly-once of at-least-once >= 0.7: PASS (0.74)" in text
    assert "of bare >= 0.5: FAIL (0.45); CPU <= 10 µs/event: FAIL (14.5)" in text


def test_the_transport_is_read_from_libpq_s_host():
    assert transport("127.0.0.1") == "tcp"
    assert transport("db.internal") == "tcp"
    assert transport("/work/.stack/run") == "unix"
    assert transport("@abstract") == "unix"
    assert transport("") == "unix"  # libpq's default: its socket directory
    dsn = with_host("host=127.0.0.1 port=21432 dbname=cdc_bench user=postgres password=x", "/tmp/run")
    assert "host=/tmp/run" in dsn and "port=21432" in dsn and "password=x" in dsn


def test_arguments():
    args = parse_args(["--events", "2000", "--unix-socket", "--no-exactly-once"])
    assert (args.events, args.unix_socket, args.exactly_once) == (2000, True, False)
    assert parse_args(["--quick"]).events == 100_000


def test_the_tracing_phase_reads_each_drains_exact_cpu_and_shows_the_pairs():
    from tests.bench.tracing import _exact, lines

    window = {"records_at_first_poll": 1_000, "records_at_last_poll": 251_000, "relay_cpu_s": 2.0}
    assert _exact({"cpu_window": window}) == 8.0  # 2 s over 250,000 records, unrounded
    assert _exact({"cpu_window": {**window, "records_at_last_poll": 1_000}}) is None
    assert _exact({}) is None
    result = {
        "events": 300_000,
        "exporter": "jaeger",
        "repeat": 3,
        "runs": {
            "off": {"tracing": "off", "events_per_s": 120_000, "cpu_us_per_event": 8.0, "cpu_of_off": 1.0},
            "1%": {
                "tracing": "row-context-only",
                "events_per_s": 118_000,
                "cpu_us_per_event": 8.3,
                "cpu_of_off": 1.038,
                "cpu_of_off_pairs": [1.02, 1.04, 1.09],
                "cpu_of_off_paired": 1.04,
                "cpu_of_off_mean": 1.05,
                "cpu_of_off_ci95": 0.09,
            },
        },
    }
    shown = "\n".join(lines(result))
    assert "drain by drain: 1.04 (median of 3 pairs [1.02, 1.04, 1.09])" in shown
    assert shown.count("drain by drain") == 1, "off has no pairs of its own"
    assert "their mean: 1.05 ± 0.09 (95%)" in shown


def test_the_pairs_mean_comes_with_its_95_percent_interval():
    from tests.bench.tracing import mean_interval

    assert mean_interval([]) == (None, None) and mean_interval([1.04]) == (1.04, None)
    mean, half = mean_interval([1.0, 1.1])  # t(1) = 12.706, standard error 0.05
    assert mean == 1.05 and half == 0.635
    mean, half = mean_interval([1.0, 1.02, 1.04] * 10)  # 30 values: t(29) = 2.042
    assert mean == 1.02 and half == 0.006  # 2.042 x 0.0166 / sqrt(30)


def test_the_cold_span_tool_times_the_relays_span_code_both_ways(capsys, compiled_extension):
    from tests.bench import cold_span

    for way in ([], ["--python"]):
        cold_span.main(["--spans", "5", "--other-mb", "0.1", *way])
        shown = capsys.readouterr().out.splitlines()
        assert [line.split(":")[0] for line in shown] == ["warm", "cold", "warm", "cold"]
        assert all("µs a span (start " in line for line in shown)
