"""Writing outbox rows: the bulk fill before the throughput phase, and the paced load of the latency phase
(run in its own process so that its clock does not share a GIL with the bench's consumer)."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.bench.db import connect
from tests.children import die_with_parent_now

_INSERT_LSN = "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint"


def bulk_fill(dsn: str, *, events: int, rows_per_txn: int, aggregates: int, first: int = 0) -> dict[str, Any]:
    """Insert ``events`` rows in transactions of ``rows_per_txn`` (one COMMIT each, inside a procedure; the
    last one from here, to learn an LSN that only its confirmation passes: ``target_lsn``)."""
    if events % rows_per_txn:
        raise ValueError(f"--events must be a multiple of {rows_per_txn}")
    transactions = events // rows_per_txn
    with connect(dsn) as conn:
        # The fill is not what is measured: do not wait for an fsync per transaction.
        conn.execute("SET synchronous_commit = off")
        (start_lsn,) = conn.execute(_INSERT_LSN).fetchone()
        started = time.monotonic()
        conn.execute("CALL bench_fill(%s, %s, %s, %s)", (first, transactions - 1, rows_per_txn, aggregates))
        target_lsn = insert_marked(
            conn, first=first + (transactions - 1) * rows_per_txn, rows=rows_per_txn, aggregates=aggregates
        )
        seconds = time.monotonic() - started
        (end_lsn,) = conn.execute(_INSERT_LSN).fetchone()
        row = conn.execute(
            "SELECT avg(octet_length(payload::text)), count(DISTINCT aggregate_id) "
            "FROM (SELECT payload, aggregate_id FROM public.outbox LIMIT 10000) s"
        ).fetchone()
    return {
        "events": events,
        "transactions": transactions,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "start_lsn": int(start_lsn),
        "target_lsn": target_lsn,
        "wal_bytes": int(end_lsn) - int(start_lsn),
        "avg_payload_bytes": round(float(row[0]), 1),
        "distinct_aggregates_in_sample": int(row[1]),
    }


def insert_marked(conn: Any, *, first: int, rows: int, aggregates: int) -> int:
    """Insert ``rows`` events in one transaction on ``conn`` (autocommit) and return the WAL insert position
    after its inserts, before its commit. The pipeline's slot passes that position when it confirms this
    transaction's commit (so everything before it); the only other way is an idle pipeline confirming a
    keepalive position after the walsender decoded past it, possible solely between this read and the
    commit's flush (a few ms, commit flushed at once), and only when nothing is in flight: never at the end
    of a backlog. Reading pg_current_wal_insert_lsn() after the commit instead could point past WAL that
    other databases are still writing, which the slot passes only at a later keepalive."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute("SELECT bench_insert_batch(%s, %s, %s)", (first, rows, aggregates))
        (lsn,) = conn.execute(_INSERT_LSN).fetchone()
    return int(lsn)


def paced_load(
    dsn: str,
    rate: float,
    rows_per_txn: int,
    seconds: float,
    first: int,
    aggregates: int,
    connections: int,
    results: Any,
    parent: int | None = None,
) -> None:
    """Commit a transaction of ``rows_per_txn`` rows every ``rows_per_txn / rate`` s on a monotonic schedule
    (open loop: a late transaction is sent at once, never skipped), over up to ``connections`` concurrent
    connections, as many application sessions would; put a dict of figures on ``results``. Dies with
    ``parent`` (the pid of the process that started this one) when given."""
    if parent is not None:
        die_with_parent_now(parent)
    try:
        interval = rows_per_txn / rate
        transactions = max(1, round(seconds * rate / rows_per_txn))
        statement = "SELECT bench_insert_batch(%s, %s, %s)"
        lock = threading.Lock()
        state = {"next": 0, "late": 0, "max_late": 0.0, "started": 0.0}
        commit_ms: list[float] = []
        errors: list[str] = []

        def start_clock() -> None:
            state["started"] = time.monotonic() + 0.05

        ready = threading.Barrier(connections, action=start_clock)

        def worker() -> None:
            try:
                with connect(dsn) as conn:
                    cur = conn.cursor()
                    cur.execute(statement, (first, 0, aggregates), prepare=True)  # planned before the clock
                    ready.wait(30)
                    while True:
                        with lock:
                            i = state["next"]
                            state["next"] += 1
                        if i >= transactions:
                            return
                        due = state["started"] + i * interval
                        now = time.monotonic()
                        if now < due:
                            time.sleep(due - now)
                            now = time.monotonic()
                        cur.execute(
                            statement, (first + i * rows_per_txn, rows_per_txn, aggregates), prepare=True
                        )
                        done = time.monotonic()
                        with lock:
                            lateness = now - due
                            state["late"] += lateness > interval
                            state["max_late"] = max(state["max_late"], lateness)
                            state["last_done"] = done
                            commit_ms.append((done - now) * 1000)
            except BaseException as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                ready.abort()

        threads = [threading.Thread(target=worker, name=f"loader-{n}") for n in range(connections)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        elapsed = state["last_done"] - state["started"]
        commit_ms.sort()
        events = transactions * rows_per_txn
        results.put(
            {
                "target_events_per_s": rate,
                "transactions": transactions,
                "rows_per_txn": rows_per_txn,
                "connections": connections,
                "events": events,
                "seconds": round(elapsed, 3),
                "achieved_events_per_s": round(events / elapsed, 1),
                "transactions_late_by_more_than_one_interval": state["late"],
                "max_lateness_ms": round(state["max_late"] * 1000, 2),
                "insert_commit_ms_p50": round(commit_ms[len(commit_ms) // 2], 2),
                "insert_commit_ms_p99": round(
                    commit_ms[min(len(commit_ms) - 1, int(len(commit_ms) * 0.99))], 2
                ),
                "insert_commit_ms_max": round(commit_ms[-1], 2),
                "loader_cpu_seconds": round(time.process_time(), 2),
            }
        )
    except BaseException as exc:  # report, do not hang the bench waiting for a result
        results.put({"error": f"{type(exc).__name__}: {exc}"})
        raise
