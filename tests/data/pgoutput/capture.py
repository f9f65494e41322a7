"""Capture real pgoutput replication traffic for the decoder's unit tests.

Run against a throwaway PostgreSQL (15+) cluster with ``wal_level = logical``,
``max_prepared_transactions > 0``, ``logical_decoding_work_mem = 64kB`` (so that the bulk transactions are
streamed) and ``wal_sender_timeout = 4s`` (so that a reply-requested keepalive arrives quickly), as a
superuser (replication origins need one); see README.md::

    python tests/data/pgoutput/capture.py --dsn "host=127.0.0.1 port=55499 user=postgres dbname=postgres"

The script (re)creates its tables, a publication and one pgoutput slot per capture, runs a scripted workload,
then streams each slot with ``START_REPLICATION`` and writes every raw CopyData message (the whole 'w'/'k'
envelope) to ``<capture>.bin``: a sequence of records, each a 4-byte big-endian length and that many bytes.
``index.json`` describes the workload (xids, relation and type OIDs, columns) and, per capture, every
message's envelope kind, pgoutput kind and whether it was inside a stream, all derived from the raw bytes and
the catalog independently of ``cdc.stream.pgoutput``: the script does not import the decoder on purpose.
"""

from __future__ import annotations

import argparse
import json
import re
import select
import struct
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq

HERE = Path(__file__).resolve().parent
PG_EPOCH_UNIX_S = 946_684_800
PUBLICATION = "cdc_capture_pub"
TABLES = ("outbox", "accounts", "docs", "bulk")

# name -> (START_REPLICATION options, create the slot with two_phase)
CAPTURES: dict[str, tuple[dict[str, str], bool]] = {
    "v1": ({"proto_version": "1"}, False),
    "v1_binary": ({"proto_version": "1", "binary": "true"}, False),
    "v2": ({"proto_version": "2", "streaming": "on"}, False),
    "v3": ({"proto_version": "3", "streaming": "on", "two_phase": "on"}, True),
}

SCHEMA = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregate_type text NOT NULL,
    aggregate_id text NOT NULL,
    event_type text NOT NULL,
    schema_version int NOT NULL,
    payload jsonb NOT NULL,
    headers jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE accounts (id int PRIMARY KEY, owner varchar(20) NOT NULL, balance bigint, mood mood);
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, title text NOT NULL, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE bulk (id int PRIMARY KEY, pad text NOT NULL);
CREATE PUBLICATION cdc_capture_pub FOR TABLE outbox, accounts, docs, bulk (id);
"""

OUTBOX_INSERT = (
    "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,"
    " created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)


def outbox_row(n: int, headers: str | None = None) -> tuple[Any, ...]:
    return (
        f"00000000-0000-4000-8000-{n:012d}",
        "order",
        f"order-{n}",
        "OrderPlaced",
        1,
        f'{{"total": {n * 10}, "items": ["a", "b"]}}',
        headers,
        f"2024-05-01 12:00:0{n}+00",
    )


def current_xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0]) & 0xFFFFFFFF


def newest_xid(conn: psycopg.Connection[Any]) -> int:
    """The newest xid this session holds: the current subtransaction's, once it has written."""
    row = conn.execute(
        "SELECT max(transactionid::text::bigint) FROM pg_locks"
        " WHERE pid = pg_backend_pid() AND locktype = 'transactionid'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def now_us(conn: psycopg.Connection[Any]) -> int:
    """The server's clock, microseconds since the Unix epoch."""
    row = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def current_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def setup(conn: psycopg.Connection[Any]) -> None:
    for name in CAPTURES:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (f"capture_{name}",),
        )
    conn.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
    conn.execute("DROP TABLE IF EXISTS " + ", ".join(TABLES))
    conn.execute("DROP TYPE IF EXISTS mood")
    conn.execute(
        "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname = 'upstream_node'"
    )
    conn.execute(SCHEMA)
    conn.execute("SELECT pg_replication_origin_create('upstream_node')")
    # Every slot is created before the workload, so every slot sees the same changes.
    for name, (_options, two_phase) in CAPTURES.items():
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
            (f"capture_{name}", two_phase),
        )


def catalog(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    relations: dict[str, Any] = {}
    for table in TABLES:
        row = conn.execute(
            "SELECT c.oid::int, n.nspname, c.relname, c.relreplident FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
            (table,),
        ).fetchone()
        assert row is not None
        columns = conn.execute(
            "SELECT a.attname, a.atttypid::int, a.atttypmod,"
            " coalesce(a.attnum = ANY(i.indkey::int2[]), false) AS is_pk"
            " FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (row[0],),
        ).fetchall()
        relations[table] = {
            "oid": row[0],
            "namespace": row[1],
            "name": row[2],
            "replica_identity": row[3],
            "columns": [
                {"name": c[0], "type_oid": c[1], "type_modifier": c[2], "primary_key": c[3]} for c in columns
            ],
        }
    row = conn.execute("SELECT 'mood'::regtype::oid::int").fetchone()
    assert row is not None
    return {"relations": relations, "types": {"public.mood": row[0]}}


def workload(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Run the scripted workload; return one entry per transaction / non-transactional message, in order."""
    steps: list[dict[str, Any]] = []

    def txn(label: str, *statements: tuple[str, tuple[Any, ...]], finish: str = "COMMIT") -> dict[str, Any]:
        conn.execute("BEGIN")
        xid = current_xid(conn)
        for sql, params in statements:
            conn.execute(sql, params)
        conn.execute(finish)
        step = {"label": label, "xid": xid}
        steps.append(step)
        return step

    txn("outbox_insert", (OUTBOX_INSERT, outbox_row(1)))
    txn(
        "outbox_with_message",
        (OUTBOX_INSERT, outbox_row(2, '{"traceparent": "00-abc-def-01"}')),
        ("SELECT pg_logical_emit_message(true, 'outbox', %s)", ('{"id": 2, "note": "transactional"}',)),
    )
    conn.execute("SELECT pg_logical_emit_message(false, 'heartbeat', '\\x00010270696e67'::bytea)")
    steps.append({"label": "heartbeat_message"})
    txn(
        "accounts_insert",
        ("INSERT INTO accounts VALUES (1, 'alice', 100, 'happy'), (2, 'bob', NULL, 'sad')", ()),
    )
    txn("accounts_update_full", ("UPDATE accounts SET balance = 150 WHERE id = 1", ()))
    txn("accounts_delete_full", ("DELETE FROM accounts WHERE id = 2", ()))
    txn("docs_insert", ("INSERT INTO docs VALUES (1, 'first', repeat('lorem ipsum ', 400))", ()))
    txn("docs_update_unchanged_toast", ("UPDATE docs SET title = 'renamed' WHERE id = 1", ()))
    txn("docs_update_key", ("UPDATE docs SET id = 2 WHERE id = 1", ()))
    txn("docs_delete_key", ("DELETE FROM docs WHERE id = 2", ()))

    conn.execute("SELECT pg_replication_origin_session_setup('upstream_node')")
    conn.execute("BEGIN")
    xid = current_xid(conn)
    conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF01', '2024-01-02 03:04:05+00')")
    conn.execute(OUTBOX_INSERT, outbox_row(3))
    conn.execute("COMMIT")
    conn.execute("SELECT pg_replication_origin_session_reset()")
    steps.append(
        {"label": "origin_insert", "xid": xid, "origin": "upstream_node", "origin_lsn": "0/ABCDEF01"}
    )

    txn("two_phase_commit", (OUTBOX_INSERT, outbox_row(4)), finish="PREPARE TRANSACTION 'capture-gid-commit'")
    conn.execute("COMMIT PREPARED 'capture-gid-commit'")
    steps[-1]["gid"] = "capture-gid-commit"
    txn(
        "two_phase_rollback",
        (OUTBOX_INSERT, outbox_row(5)),
        finish="PREPARE TRANSACTION 'capture-gid-rollback'",
    )
    conn.execute("ROLLBACK PREPARED 'capture-gid-rollback'")
    steps[-1]["gid"] = "capture-gid-rollback"

    # Bigger than logical_decoding_work_mem: streamed with streaming 'on'. The pad column is not published.
    conn.execute("BEGIN")
    xid = current_xid(conn)
    conn.execute("INSERT INTO bulk SELECT g, repeat('x', 1000) FROM generate_series(1, 150) g")
    conn.execute("SAVEPOINT s1")
    conn.execute("INSERT INTO bulk SELECT g, repeat('y', 1000) FROM generate_series(1001, 1150) g")
    aborted_subxid = newest_xid(conn)
    conn.execute("ROLLBACK TO SAVEPOINT s1")  # the savepoint lives on in a new subtransaction
    conn.execute("INSERT INTO bulk VALUES (2000, 'z')")
    subxid = newest_xid(conn)
    conn.execute("COMMIT")
    steps.append(
        {"label": "bulk_streamed_commit", "xid": xid, "aborted_subxid": aborted_subxid, "subxid": subxid}
    )
    txn(
        "bulk_streamed_abort",
        ("INSERT INTO bulk SELECT g, repeat('w', 1000) FROM generate_series(3001, 3150) g", ()),
        finish="ROLLBACK",
    )
    txn("truncate_plain", ("TRUNCATE bulk", ()))
    txn("truncate_cascade_restart", ("TRUNCATE accounts, docs RESTART IDENTITY CASCADE", ()))
    conn.execute("SELECT pg_logical_emit_message(false, 'capture-end', 'done')")
    steps.append({"label": "end_marker"})
    return steps


def read_copy(pgconn: pq.abc.PGconn, timeout: float) -> bytes | None:
    """The next CopyData message, or None at the end of the copy stream."""
    deadline = time.monotonic() + timeout
    while True:
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes > 0:
            return bytes(data)
        if nbytes == -1:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no replication message within the timeout")
        select.select([pgconn.socket], [], [], remaining)
        pgconn.consume_input()


def status_update(lsn: int, client_time: int, reply: bool) -> bytes:
    return struct.pack(">cQQQqB", b"r", lsn, lsn, lsn, client_time, int(reply))


def capture(dsn: str, admin: psycopg.Connection[Any], name: str, options: dict[str, str]) -> dict[str, Any]:
    slot = f"capture_{name}"
    options = {**options, "publication_names": PUBLICATION, "messages": "true"}
    opts = ", ".join(f"{key} '{value}'" for key, value in options.items())
    command = f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({opts})"
    records: list[bytes] = []
    index: list[dict[str, Any]] = []
    in_stream = False
    # Not a context manager: leaving one would try to COMMIT on a connection that is in COPY BOTH mode.
    conn = psycopg.connect(dsn, replication="database", autocommit=True)
    try:
        pgconn = conn.pgconn
        pgconn.send_query(command.encode())
        result = pgconn.get_result()
        assert result is not None and result.status == pq.ExecStatus.COPY_BOTH, result
        seen_end = False
        feedback: dict[str, Any] | None = None
        while True:
            data = read_copy(pgconn, 15.0)
            assert data is not None, "the server ended the copy stream"
            records.append(data)
            entry: dict[str, Any] = {"envelope": chr(data[0]), "length": len(data)}
            if data[0] == ord("w"):
                kind = chr(data[25])
                if kind == "E":
                    in_stream = False
                entry.update(kind=kind, in_stream=in_stream)
                if kind == "S":
                    in_stream = True
                if kind == "M" and b"capture-end\x00" in data:
                    seen_end = True
            elif data[0] == ord("k"):
                wal_end, _send_time, reply_requested = struct.unpack_from(">QqB", data, 1)
                entry["reply_requested"] = bool(reply_requested)
                if seen_end and feedback is not None:
                    index.append(entry)
                    break  # the immediate answer to our reply-requested status update
                if seen_end and reply_requested:
                    client_time = int((time.time() - PG_EPOCH_UNIX_S) * 1_000_000)
                    message = status_update(wal_end, client_time, True)
                    pgconn.put_copy_data(message)
                    pgconn.flush()
                    feedback = {"lsn": wal_end, "client_time": client_time, "hex": message.hex()}
            index.append(entry)
    finally:
        conn.close()
    assert feedback is not None
    for _ in range(50):
        row = admin.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        assert row is not None
        if int(row[0]) == feedback["lsn"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{slot}: confirmed_flush_lsn {row[0]} != the flushed LSN we sent")
    feedback["confirmed_flush_lsn"] = int(row[0])
    with open(HERE / f"{name}.bin", "wb") as out:
        for record in records:
            out.write(struct.pack(">I", len(record)))
            out.write(record)
    return {"file": f"{name}.bin", "command": command, "status_update": feedback, "messages": index}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="libpq conninfo of a superuser on a throwaway cluster")
    args = parser.parse_args()
    dsn = f"{args.dsn} options='-c TimeZone=UTC -c DateStyle=ISO'"
    with psycopg.connect(dsn, autocommit=True) as admin:
        setup(admin)
        server_version = admin.execute("SHOW server_version").fetchone()
        lsn_before, time_before = current_lsn(admin), now_us(admin)
        steps = workload(admin)
        lsn_after, time_after = current_lsn(admin), now_us(admin)
        index: dict[str, Any] = {
            "server_version": server_version[0] if server_version else None,
            "publication": PUBLICATION,
            "wal_lsn_before_workload": lsn_before,
            "wal_lsn_after_workload": lsn_after,
            "workload_started_us": time_before,
            "workload_finished_us": time_after,
            **catalog(admin),
            "workload": steps,
            "captures": {},
        }
        for name, (options, _two_phase) in CAPTURES.items():
            started = now_us(admin)
            index["captures"][name] = {"started_us": started, **capture(dsn, admin, name, options)}
            index["captures"][name]["finished_us"] = now_us(admin)
        for name in CAPTURES:
            admin.execute("SELECT pg_drop_replication_slot(%s)", (f"capture_{name}",))
    # One line per message entry, to keep the index readable.
    text = re.sub(
        r"\{\n\s*(\"envelope\"[^{}]*?)\n\s*\}",
        lambda m: "{" + re.sub(r"\n\s*", " ", m.group(1)) + "}",
        json.dumps(index, indent=1),
    )
    (HERE / "index.json").write_text(text + "\n")
    for name, cap in index["captures"].items():
        print(f"{name}: {len(cap['messages'])} messages")


if __name__ == "__main__":
    main()
