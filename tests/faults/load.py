"""The fault suite's load: small outbox transactions, some rolled back, that survive PostgreSQL restarts.

Each transaction holds 1-50 rows over six aggregates (three ``order``, three ``invoice``), about one in ten is
rolled back, and every row carries its aggregate's next sequence number in the payload. One connection writes
them one after another, so sequence order is commit order.

A commit that raises leaves its outcome unknown (the server may have committed before the connection broke).
Such a transaction is looked up by its ids once the database answers again: all there means committed, none
means not; only ids known committed count as events that must arrive. A transaction that failed before its
COMMIT was sent never committed and counts with the rolled-back ones.

The big transaction (``big_transaction``) inserts ``rows`` rows with one INSERT ... SELECT on a connection of
its own, over aggregates of its own (``big-0`` .. ``big-5``), with ids derived from a tag so that the ledger
needs no round trip for a million ids. If a fault aborts it, it is tried again under a new tag.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from tests.faults.check import Ledger

log = logging.getLogger("faults.load")

AGGREGATES = [("order", f"order-{i}") for i in range(3)] + [("invoice", f"invoice-{i}") for i in range(3)]
AGGREGATE_TYPES = ("order", "invoice")
EVENT_TYPE = "FaultEvent"
BIG_AGGREGATES = 6


@dataclass
class LoadStats:
    transactions: int = 0
    committed: int = 0
    rolled_back: int = 0
    aborted: int = 0  # failed before COMMIT
    unknown_resolved: int = 0
    reconnects: int = 0
    big: list[str] = field(default_factory=list)  # what became of each big transaction attempt


def _ids_for(tag: str, count: int) -> Iterator[str]:
    for i in range(1, count + 1):
        yield str(uuid.UUID(hashlib.md5(f"{tag}{i}".encode()).hexdigest()))


class Load:
    def __init__(self, dsn: str, table: str, *, seed: int, rate: float) -> None:
        self.dsn = dsn
        self.table = sql.Identifier(table)
        self.rng = random.Random(seed * 7919 + 1)
        self.rate = rate
        self.ledger = Ledger()
        self.stats = LoadStats()
        self._lock = threading.Lock()  # the ledger is shared with the big transaction's thread
        self._seq = dict.fromkeys((a for _, a in AGGREGATES), 0)
        self._unknown: list[list[tuple[str, str, int]]] = []
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    # -- the small transactions ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, connect_timeout=5)
            self.stats.reconnects += 1
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _run(self) -> None:
        interval = 1.0 / self.rate
        number = 0
        while not self._stop.is_set():
            started = time.monotonic()
            number += 1
            try:
                self._resolve_unknown()
                self._one(number)
            except psycopg.Error as exc:
                log.info(
                    "load: %s; reconnecting", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                )
                self._drop_connection()
                self._stop.wait(0.5)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
        self._drop_connection()

    def _one(self, number: int) -> None:
        rng = self.rng
        rows = []
        for _ in range(rng.randint(1, 50)):
            aggregate_type, aggregate = rng.choice(AGGREGATES)
            self._seq[aggregate] += 1
            rows.append((str(uuid.uuid4()), aggregate, self._seq[aggregate], aggregate_type))
        rollback = rng.random() < 0.1
        conn = self._connection()
        self.stats.transactions += 1
        try:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
                    " SELECT i, t, a, %s, 1, jsonb_build_object('aggregate', a, 'seq', s, 'txn', %s::bigint,"
                    " 'pad', repeat('p', 40))"
                    " FROM unnest(%s::uuid[], %s::text[], %s::bigint[], %s::text[]) AS r(i, a, s, t)"
                ).format(self.table),
                (
                    EVENT_TYPE,
                    number,
                    [r[0] for r in rows],
                    [r[1] for r in rows],
                    [r[2] for r in rows],
                    [r[3] for r in rows],
                ),
            )
        except psycopg.Error:
            self._aborted(rows)
            raise
        if rollback:
            try:
                conn.rollback()
            finally:
                with self._lock:
                    self.ledger.rolled_back.update(r[0] for r in rows)
                self.stats.rolled_back += 1
            return
        try:
            conn.commit()
        except psycopg.Error:
            self._unknown.append([(r[0], r[1], r[2]) for r in rows])
            raise
        self._committed([(r[0], r[1], r[2]) for r in rows])

    def _aborted(self, rows: list[tuple[str, str, int, str]]) -> None:
        with self._lock:
            self.ledger.rolled_back.update(r[0] for r in rows)
        self.stats.aborted += 1

    def _committed(self, rows: list[tuple[str, str, int]]) -> None:
        with self._lock:
            self.ledger.committed.update((i, (a, s)) for i, a, s in rows)
        self.stats.committed += 1

    def _resolve_unknown(self) -> None:
        """Look up the transactions whose COMMIT raised: committed if their rows are there."""
        while self._unknown:
            rows = self._unknown[0]
            conn = self._connection()
            found = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s::uuid[])").format(self.table),
                ([r[0] for r in rows],),
            ).fetchone()
            conn.rollback()
            assert found is not None
            if found[0] == len(rows):
                self._committed(rows)
            elif found[0] == 0:
                with self._lock:
                    self.ledger.rolled_back.update(r[0] for r in rows)
                self.stats.aborted += 1
            else:
                raise AssertionError(f"{found[0]} of {len(rows)} rows of one transaction are in the table")
            self.stats.unknown_resolved += 1
            self._unknown.pop(0)

    def resolve_all(self, timeout: float = 120) -> None:
        """After the load stopped: settle every unknown outcome (the database must answer by then)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._resolve_unknown()
                self._drop_connection()
                return
            except psycopg.Error:
                self._drop_connection()
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    # -- the big transaction ------------------------------------------------------------------------------

    def big_transaction(self, rows: int, tag: str) -> None:
        """One transaction of ``rows`` rows; tried again under a new tag when a fault aborts it."""
        for attempt in range(1, 20):
            attempt_tag = f"{tag}-{attempt}-"
            started = time.monotonic()
            try:
                conn = psycopg.connect(self.dsn, connect_timeout=5)
                try:
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version,"
                            " payload) SELECT md5(%s || i)::uuid, 'order', 'big-' || (i %% %s), %s, 1,"
                            " jsonb_build_object('aggregate', 'big-' || (i %% %s), 'seq', i, 'txn', -1,"
                            " 'pad', 'b') FROM generate_series(1, %s) AS i"
                        ).format(self.table),
                        (attempt_tag, BIG_AGGREGATES, EVENT_TYPE, BIG_AGGREGATES, rows),
                    )
                    try:
                        conn.commit()
                    except psycopg.Error:
                        if not self._big_committed(attempt_tag):  # not committed, or cannot tell yet
                            raise
                finally:
                    conn.close()
                self._big_ledger(attempt_tag, rows)
                self.stats.big.append(f"{rows} rows committed in {time.monotonic() - started:.1f} s")
                return
            except psycopg.Error as exc:
                self.stats.big.append(f"attempt {attempt} failed ({type(exc).__name__})")
                time.sleep(2)
        raise AssertionError("the big transaction never committed")

    def _big_committed(self, tag: str) -> bool | None:
        """Whether the big transaction under ``tag`` committed (None while the database does not answer)."""
        first = next(_ids_for(tag, 1))
        for _ in range(60):
            try:
                with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                    row = conn.execute(
                        sql.SQL("SELECT count(*) FROM {} WHERE id = %s").format(self.table), (first,)
                    ).fetchone()
                    return bool(row and row[0])
            except psycopg.Error:
                time.sleep(1)
        return None

    def _big_ledger(self, tag: str, rows: int) -> None:
        entries = {
            id_: (f"big-{i % BIG_AGGREGATES}", i) for i, id_ in enumerate(_ids_for(tag, rows), start=1)
        }
        with self._lock:
            self.ledger.committed.update(entries)
