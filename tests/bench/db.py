"""The bench database: dropped and re-created each run, with the outbox table and publication of
``cdc setup``, extra pgoutput slots, and SQL functions that generate OrderPlaced events in bulk."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TABLE = "public.outbox"

# PAYLOADS distinct ~310-byte OrderPlaced v1 payloads (4 to 6 items), built once by text concatenation into
# bench_payloads, so that inserting an event costs the load generator little CPU: on a 2-core machine every
# cycle it spends is taken from the pipeline, the walsender and Kafka. Event ids derive from the generator
# index g, which never repeats within a run; g also picks one of a few hundred aggregates.
PAYLOADS = 10_000
_ITEM = """'{"sku": "SKU-' || lpad(((g * 31 + {k} * 977) % 1000000)::text, 7, '0') || '", "quantity": ' ||
                (1 + (g + {k}) % 5) || '}'"""
_PAYLOADS = """
CREATE TABLE bench_payloads (n int PRIMARY KEY, payload jsonb NOT NULL);
INSERT INTO bench_payloads (n, payload)
SELECT g, ('{"order_id": "ord-' || lpad(g::text, 12, '0') ||
           '", "customer_id": "cust-' || lpad(((g * 7) % 100000)::text, 8, '0') ||
           '", "amount_cents": ' || (500 + (g * 7919) % 250000) ||
           ', "currency": "' || (ARRAY['EUR', 'USD', 'GBP', 'CHF'])[1 + g % 4] ||
           '", "items": [' || {item1} || ', ' || {item2} || ', ' || {item3} || ', ' || {item4} ||
           CASE WHEN g % 3 >= 1 THEN ', ' || {item5} ELSE '' END ||
           CASE WHEN g % 3 >= 2 THEN ', ' || {item6} ELSE '' END || ']}')::jsonb
FROM generate_series(0, {count} - 1) AS g;
ANALYZE bench_payloads;
"""
_FUNCTIONS = """
SET check_function_bodies = off;  -- public.outbox is created later, by cdc setup

CREATE FUNCTION bench_insert_batch(p_first bigint, p_rows int, p_aggregates int) RETURNS void
LANGUAGE sql AS $fn$
INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload)
SELECT md5('bench-event-' || g)::uuid, 'order', 'order-' || ((g * 7919) % p_aggregates), 'OrderPlaced', 1,
       (SELECT p.payload FROM bench_payloads p WHERE p.n = g % {count})
FROM generate_series(p_first, p_first + p_rows - 1) AS g
$fn$;

CREATE PROCEDURE bench_fill(p_first bigint, p_transactions int, p_rows int, p_aggregates int)
LANGUAGE plpgsql AS $fn$
BEGIN
    FOR t IN 0 .. p_transactions - 1 LOOP
        PERFORM bench_insert_batch(p_first + t::bigint * p_rows, p_rows, p_aggregates);
        COMMIT;
    END LOOP;
END
$fn$;

RESET check_function_bodies;
"""


def generator_sql() -> str:
    """The payload table and the generator, to run before ``cdc setup`` so that no slot decodes the
    payload table's inserts. bench_insert_batch(first, rows, aggregates) inserts ``rows`` events in one
    statement (one transaction in autocommit); bench_fill(first, transactions, rows, aggregates) commits after
    each batch."""
    payloads = _PAYLOADS
    for k in range(1, 7):
        payloads = payloads.replace(f"{{item{k}}}", _ITEM.replace("{k}", str(k)))
    return (payloads + _FUNCTIONS).replace("{count}", str(PAYLOADS))


def dsn_for(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    kwargs.setdefault("autocommit", True)
    kwargs.setdefault("connect_timeout", 10)
    return psycopg.connect(dsn, **kwargs)


def drop_slots(admin: psycopg.Connection[Any], where: str, value: str) -> list[str]:
    """Drop the slots where ``<where> = value`` (``database`` or ``slot_name``), ending their walsenders."""
    query = sql.SQL("SELECT slot_name FROM pg_replication_slots WHERE {} = %s").format(sql.Identifier(where))
    dropped = []
    for (slot,) in admin.execute(query, (value,)).fetchall():
        deadline = time.monotonic() + 15
        while True:
            admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            try:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except psycopg.errors.UndefinedObject:
                break
        dropped.append(slot)
    return dropped


def recreate_database(admin: psycopg.Connection[Any], name: str) -> None:
    drop_database(admin, name)
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(admin: psycopg.Connection[Any], name: str) -> None:
    drop_slots(admin, "database", name)
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def create_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


class SlotWatch:
    """Reads a slot's state from pg_replication_slots over one ordinary connection."""

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)

    def state(self, slot: str) -> tuple[bool, int | None, int]:
        """(active, active_pid, confirmed_flush_lsn as an int)."""
        row = self.conn.execute(
            "SELECT active, active_pid, (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        if row is None:
            raise RuntimeError(f"replication slot {slot} disappeared")
        return bool(row[0]), row[1], int(row[2] or 0)

    def wait_confirmed(self, slot: str, lsn: int, timeout: float) -> float:
        """Wait until the slot confirmed ``lsn``; returns the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if self.state(slot)[2] >= lsn:
                return now
            if now > deadline:
                raise TimeoutError(f"slot {slot} did not confirm {format_lsn(lsn)} within {timeout:g} s")
            time.sleep(0.1)

    def close(self) -> None:
        self.conn.close()


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def transport(host: str | None) -> str:
    """How libpq reached the server, from its ``host``: a directory (or none, libpq's default socket
    directory) is a Unix socket, anything else TCP."""
    return "unix" if not host or host.startswith(("/", "@")) else "tcp"


def with_host(dsn: str, host: str) -> str:
    """``dsn`` with another ``host`` (a directory: the Unix socket there)."""
    params = conninfo_to_dict(dsn)
    params["host"] = host
    params.pop("hostaddr", None)
    return make_conninfo(**params)
