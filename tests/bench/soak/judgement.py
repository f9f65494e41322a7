"""The soak's judgement: the limits, the check of every event at the end, growth and latency against the
limits, and the result line."""

from __future__ import annotations

import statistics
from typing import Any

from tests.bench.db import connect
from tests.bench.measure import Watermarks
from tests.bench.soak import progress

# Judgement.
P99_LIMIT_MS = 100.0
RSS_NOISE_MB, RSS_NOISE_SHARE = 10.0, 0.10
COUNT_NOISE = 2  # fds, threads
BEHIND_LIMIT_S = 5.0  # of offered load


class Judgement:
    """Failures and the verdict (a base of Soak: its args, samples, minutes, failures and result are set by
    Soak)."""

    def check_events(self, events: int, drained: bool) -> None:
        with connect(self.dsn) as conn:
            conn.execute("SET statement_timeout = '15min'")
            if "missing" in self.args.inject:
                conn.execute(
                    "DELETE FROM public.processed_events WHERE ctid IN "
                    "(SELECT ctid FROM public.processed_events WHERE consumer = %s LIMIT 5)",
                    (self.consumer_name,),
                )
                progress("inject: deleted 5 rows of processed_events")
            absent = conn.execute(
                "SELECT md5('soak-event-' || g)::uuid::text FROM generate_series(0, %s - 1) AS g "
                "WHERE NOT EXISTS (SELECT 1 FROM public.processed_events p "
                "WHERE p.consumer = %s AND p.event_id = md5('soak-event-' || g)::uuid::text)",
                (events, self.consumer_name),
            ).fetchall()
            (processed,) = conn.execute(  # type: ignore[misc]
                "SELECT count(*) FROM public.processed_events WHERE consumer = %s", (self.consumer_name,)
            ).fetchone()
            (invoices,) = conn.execute("SELECT count(*) FROM invoices").fetchone()  # type: ignore[misc]
        dlq = {}
        for topic in (self.dlq_topic, self.consumer_dlq):
            dlq[topic] = sum(max(0, v) for v in Watermarks(self.kafka_admin, topic, 1).read().values())
        check = {
            "events": events,
            "missing": len(absent),
            "missing_ids": [row[0] for row in absent[:20]],
            "processed_rows": int(processed),
            "invoices": int(invoices),
            "dead_letters": dlq,
        }
        self.result["check"] = check
        if absent:
            if drained:
                self.failures.append(f"missing: {len(absent)} of {events} events not in processed_events")
            else:
                self.failures.append(f"not consumed by the end: {len(absent)} of {events} events")
        if invoices != events - len(absent):
            self.failures.append(f"invoices: {invoices} for {events - len(absent)} processed events")
        if any(dlq.values()):
            self.failures.append(f"dead letters: {dlq}")

    # -- judgement ---------------------------------------------------------------------------------------

    def judge(self) -> dict[str, Any]:
        samples = [s for s in self.samples if s["t"] <= self.load_seconds + 2 * self.args.sample_seconds]
        if not samples:
            return {}
        span = samples[-1]["t"]
        window = 300.0 if self.args.minutes >= 10 else span / 3
        first = [s for s in samples if s["t"] <= window]
        last = [s for s in samples if s["t"] >= span - window]
        if "growth" in self.args.inject:
            last = [{**s, "rss_run_mb": (s["rss_run_mb"] or 0) + 50} for s in last]
            progress("inject: 50 MB added to cdc run's RSS samples of the last window")
        growth: dict[str, Any] = {"window_s": round(window, 1)}
        for key in (
            "rss_run_mb",
            "rss_consumer_mb",
            "fds_run",
            "fds_consumer",
            "threads_run",
            "threads_consumer",
        ):
            a = [s[key] for s in first if s.get(key) is not None]
            b = [s[key] for s in last if s.get(key) is not None]
            if not a or not b:
                continue
            before, after = statistics.median(a), statistics.median(b)
            limit = max(RSS_NOISE_MB, RSS_NOISE_SHARE * before) if key.startswith("rss") else COUNT_NOISE
            grew = after - before > limit
            growth[key] = {
                "first": round(before, 1),
                "last": round(after, 1),
                "limit": round(limit, 1),
                "grew": grew,
            }
            if grew:
                self.failures.append(
                    f"growth: {key} {before:.1f} -> {after:.1f} (median of the first {window:.0f} s against "
                    f"the last), more than {limit:.1f}"
                )
        over, unexplained = [], []
        for m in self.minutes:
            if m["p99_ms"] is None:
                if m["offered_per_s"] > 0:
                    unexplained.append(m["minute"])
                    self.failures.append(f"latency: no record arrived in minute {m['minute']}")
                continue
            if m["p99_ms"] > P99_LIMIT_MS:
                over.append(m["minute"])
                if not m["checkpoint"] and not m["vacuum"]:
                    unexplained.append(m["minute"])
                    self.failures.append(
                        f"latency: p99 {m['p99_ms']} ms in minute {m['minute']}, "
                        "no checkpoint or vacuum in it"
                    )
        return {"growth": growth, "p99_over_minutes": over, "unexplained_p99_minutes": unexplained}

    def final_line(self, verdict: dict[str, Any]) -> str:
        check = self.result.get("check", {})
        growth = verdict.get("growth", {})

        def pair(key: str) -> str:
            g = growth.get(key)
            return f"{g['first']:g}/{g['last']:g}" if g else "n/a"

        p99s = [m["p99_ms"] for m in self.minutes if m["p99_ms"] is not None]
        lags = [m["slot_lag_mb"] for m in self.minutes]
        ack = self.result.get("commit_to_ack") or {}

        def pairs(values: dict[str, Any] | None) -> str:
            return ",".join(f"{k}:{v}" for k, v in (values or {}).items()) or "n/a"

        return (
            f"soak: result={self.result['result']} minutes={self.args.minutes:g} rate={self.args.rate:g}/s "
            f"offered={self.result.get('offered_per_s', 'n/a')}/s events={check.get('events', 'n/a')} "
            f"missing={check.get('missing', 'n/a')} invoices={check.get('invoices', 'n/a')} "
            f"rss_run_mb={pair('rss_run_mb')} rss_consumer_mb={pair('rss_consumer_mb')} "
            f"fds_run={pair('fds_run')} fds_consumer={pair('fds_consumer')} "
            f"threads_run={pair('threads_run')} "
            f"threads_consumer={pair('threads_consumer')} p99_max_ms={max(p99s, default='n/a')} "
            f"p99_over_100_minutes={len(verdict.get('p99_over_minutes', []))} "
            f"unexplained_p99_minutes={len(verdict.get('unexplained_p99_minutes', []))} "
            f"slot_lag_max_mb={max(lags, default='n/a')} "
            f"behind_s={pairs(self.result.get('behind_s'))} "
            f"drain_s={pairs(self.result.get('drain_s'))} commit_to_ack_p99_ms={ack.get('p99_ms', 'n/a')}"
        )
