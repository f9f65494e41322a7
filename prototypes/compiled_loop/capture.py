"""Capture real pgoutput Insert messages of outbox rows from a throwaway slot on the local stack.

Writes inputs.bin: a length-prefixed list of whole XLogData CopyData messages ('w' + 24-byte envelope +
pgoutput), exactly what ReplicationSource.read() hands the pipeline, plus the Relation message first.
Rows: the bench's OrderPlaced v1 payloads (tests.bench.db), plus OrderPlaced v2 (union), CustomerRegistered
(boolean) and rows with a headers column (string values), so that the compiled path is compared on more
than one shape.

    . .stack/env && .venv/bin/python -m prototypes.compiled_loop.capture --events 20000
"""

from __future__ import annotations

import argparse
import os
import struct
from pathlib import Path

import psycopg

from tests.bench.db import generator_sql

HERE = Path(__file__).parent
SQL = """
DROP TABLE IF EXISTS public.outbox CASCADE;
DROP TABLE IF EXISTS bench_payloads CASCADE;
DROP FUNCTION IF EXISTS bench_insert_batch; DROP PROCEDURE IF EXISTS bench_fill;
CREATE TABLE public.outbox (
    id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
    schema_version int NOT NULL DEFAULT 1, headers jsonb NULL, created_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL);
DROP PUBLICATION IF EXISTS proto15e;
CREATE PUBLICATION proto15e FOR TABLE public.outbox WITH (publish = 'insert');
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args()
    dsn = os.environ["CDC_DATABASE_URL"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE slot_name = 'proto15e'")
        conn.execute(SQL)
        conn.execute(generator_sql())
        conn.execute("SELECT pg_create_logical_replication_slot('proto15e', 'pgoutput')")
        n = args.events
        main_rows = n - 600
        for first in range(0, main_rows, 1000):
            conn.execute("SELECT bench_insert_batch(%s, %s, %s)", (first, min(1000, main_rows - first), 500))
        conn.execute(
            """INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, schema_version,
                   headers, payload)
               SELECT md5('v2-' || g)::uuid, 'order', 'order-' || g, 'OrderPlaced', 2,
                      CASE WHEN g % 2 = 0 THEN jsonb_build_object('trace', 'tr-' || g, 'id', 'req-' || g,
                                                                   'tenant', 'ünïcode') END,
                      jsonb_build_object('order_id', 'o' || g, 'customer_id', 'c', 'amount_cents', g * 1000003,
                          'currency', 'EUR', 'items', '[]'::jsonb,
                          'coupon', CASE WHEN g % 3 = 0 THEN NULL ELSE 'SAVE' || g END)
               FROM generate_series(1, 300) g"""
        )
        conn.execute(
            """INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload)
               SELECT md5('cr-' || g)::uuid, 'customer', 'cust-' || g, 'CustomerRegistered', 1,
                      jsonb_build_object('customer_id', 'cust-' || g, 'email', 'a\\"b' || g || '@ex.com',
                                         'marketing_opt_in', g % 2 = 0)
               FROM generate_series(1, 300) g"""
        )
        rows = conn.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes('proto15e', NULL, NULL,"
            " 'proto_version', '1', 'publication_names', 'proto15e')"
        ).fetchall()
        conn.execute("SELECT pg_drop_replication_slot('proto15e')")
    out = bytearray()
    kinds: dict[str, int] = {}
    for lsn_text, data in rows:
        hi, lo = lsn_text.split("/")
        lsn = (int(hi, 16) << 32) | int(lo, 16)
        data = bytes(data)
        kinds[chr(data[0])] = kinds.get(chr(data[0]), 0) + 1
        msg = b"w" + struct.pack(">QQq", lsn, lsn, 0) + data
        out += struct.pack(">I", len(msg)) + msg
    (HERE / "inputs.bin").write_bytes(out)
    print(f"captured {len(rows)} messages {kinds} into {HERE / 'inputs.bin'} ({len(out)} bytes)")


if __name__ == "__main__":
    main()
