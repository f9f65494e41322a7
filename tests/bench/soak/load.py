"""The load of `make soak`: the payload table and generator function (SQL), and the load generator, a
process of its own that offers ``--rate`` events/s on an open-loop schedule."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from tests.bench.db import connect
from tests.children import die_with_parent_now

PAYLOADS = 10_000
AGGREGATES = 1_000
# Rows per transaction and the share of transactions of that size (%): 70 rows on average.
TXN_SIZES = (1, 10, 50, 200, 1000)
TXN_WEIGHTS = (30, 30, 25, 12, 3)

# The payload table and the generator, made before `cdc setup` so that no slot decodes the payload table.
GENERATOR_SQL = f"""
CREATE TABLE soak_payloads (n int PRIMARY KEY, version int NOT NULL, payload jsonb NOT NULL);
INSERT INTO soak_payloads (n, version, payload)
SELECT n, CASE WHEN pad > 0 OR n % 10 = 5 THEN 2 ELSE 1 END,
       jsonb_build_object(
           'order_id', 'ord-' || lpad(n::text, 12, '0'),
           'customer_id', 'cust-' || lpad(((n * 7) % 100000)::text, 8, '0'),
           'amount_cents', 500 + (n * 7919) % 250000,
           'currency', (ARRAY['EUR', 'USD', 'GBP', 'CHF'])[1 + n % 4],
           'items', (SELECT jsonb_agg(jsonb_build_object(
                         'sku', 'SKU-' || lpad(((n * 31 + k * 977) % 1000000)::text, 7, '0'),
                         'quantity', 1 + (n + k) % 5))
                     FROM generate_series(1, 4 + n % 3) AS k))
       || CASE WHEN pad > 0 THEN jsonb_build_object('coupon',
                   (SELECT left(string_agg(repeat(md5(n || '-' || i), 4), ''), pad)
                    FROM generate_series(1, pad / 128 + 1) AS i))
               WHEN n % 10 = 5 THEN jsonb_build_object('coupon', 'SPRING-' || n)
               ELSE '{{}}'::jsonb END
FROM (SELECT n, CASE WHEN n % 2000 = 1999 THEN 100000 WHEN n % 20 = 3 THEN 3800 ELSE 0 END AS pad
      FROM generate_series(0, {PAYLOADS} - 1) AS n) AS s;
ANALYZE soak_payloads;

SET check_function_bodies = off;  -- public.outbox is created later, by cdc setup
CREATE FUNCTION soak_insert(p_first bigint, p_rows int) RETURNS void LANGUAGE sql AS $fn$
INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload)
SELECT md5('soak-event-' || g)::uuid, 'order', 'order-' || ((g * 7919) % {AGGREGATES}), 'OrderPlaced',
       p.version, p.payload
FROM generate_series(p_first, p_first + p_rows - 1) AS g
JOIN soak_payloads p ON p.n = (g % {PAYLOADS})::int
$fn$;
RESET check_function_bodies;
"""


def offer_load(
    dsn: str,
    rate: float,
    seconds: float,
    first: int,
    connections: int,
    seed: int,
    out: Any,
    stop: Any,
    parent: int,
) -> None:
    """In a process of its own: commit transactions of mixed sizes (TXN_SIZES) of ``soak_insert`` so that
    ``rate`` events/s are offered for ``seconds`` s, each transaction due when the events scheduled before it
    are (open loop: a late one goes at once). Generator numbers are handed out in order, so the committed
    events are exactly ``[first, next_first)``. Puts a progress dict on ``out`` every second and a final one
    with ``done``; stops early when ``stop`` is set, and dies with ``parent`` (the soak's pid)."""
    die_with_parent_now(parent)
    try:
        rng = random.Random(seed)
        lock = threading.Lock()
        state: dict[str, Any] = {
            "next_first": first,
            "scheduled": 0,
            "committed": 0,
            "txns": 0,
            "max_behind": 0,
        }
        window: dict[str, Any] = {"max_late": 0.0, "commit_ms": []}
        errors: list[str] = []
        clock: dict[str, float] = {}

        def start_clock() -> None:
            clock["start"] = time.monotonic() + 0.05
            clock["end"] = clock["start"] + seconds

        ready = threading.Barrier(connections + 1, action=start_clock)

        def take() -> tuple[int, int, float] | None:
            with lock:
                if stop.is_set() or errors:
                    return None
                due = clock["start"] + state["scheduled"] / rate
                if due >= clock["end"] or time.monotonic() >= clock["end"]:
                    return None  # the end: what was due and not sent by now is counted as not offered
                rows = rng.choices(TXN_SIZES, TXN_WEIGHTS)[0]
                g = state["next_first"]
                state["next_first"] += rows
                state["scheduled"] += rows
                return g, rows, due

        def worker() -> None:
            try:
                with connect(dsn) as conn:
                    cur = conn.cursor()
                    cur.execute("SELECT soak_insert(%s, %s)", (first, 0), prepare=True)  # planned before
                    ready.wait(30)
                    while (job := take()) is not None:
                        g, rows, due = job
                        now = time.monotonic()
                        if now < due:
                            time.sleep(due - now)
                            now = time.monotonic()
                        cur.execute("SELECT soak_insert(%s, %s)", (g, rows), prepare=True)
                        done = time.monotonic()
                        with lock:
                            state["committed"] += rows
                            state["txns"] += 1
                            window["max_late"] = max(window["max_late"], now - due)
                            window["commit_ms"].append((done - now) * 1000)
            except BaseException as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                ready.abort()

        workers = [threading.Thread(target=worker, name=f"loader-{n}") for n in range(connections)]
        for thread in workers:
            thread.start()
        ready.wait(60)

        def report(**extra: Any) -> None:
            with lock:
                commit_ms = sorted(window["commit_ms"])
                elapsed = time.monotonic() - clock["start"]
                behind = max(0, round(min(elapsed, seconds) * rate) - state["committed"])
                state["max_behind"] = max(state["max_behind"], behind)
                out.put(
                    {
                        "t": time.time(),
                        "elapsed_s": round(elapsed, 3),
                        "committed": state["committed"],
                        "txns": state["txns"],
                        "next_first": state["next_first"],
                        # Of the events due by now (the schedule), how many are not committed yet.
                        "behind": behind,
                        "max_behind": state["max_behind"],
                        "max_late_ms": round(window["max_late"] * 1000, 1),
                        "commit_ms_p99": _pct(commit_ms, 0.99),
                        "commit_ms_max": round(commit_ms[-1], 1) if commit_ms else None,
                        **extra,
                    }
                )
                window["max_late"], window["commit_ms"] = 0.0, []

        while any(thread.is_alive() for thread in workers):
            time.sleep(1.0)
            report()
        for thread in workers:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        report(done=True, loader_cpu_s=round(time.process_time(), 2))
    except BaseException as exc:  # report, never leave the soak waiting
        out.put({"error": f"{type(exc).__name__}: {exc}", "done": True})
        raise


def _pct(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 1)
