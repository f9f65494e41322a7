"""The ceiling: the least a Python client must do to read the same stream as the pipeline.

START_REPLICATION with the pipeline's own pgoutput options (``cdc.stream.source.pgoutput_options``), CopyData
read with libpq's copy API as ``cdc.stream.source`` reads it (``get_copy_data`` in async mode), Insert
messages counted by their first byte, keepalives answered, a status update at the end. No decoding, no Kafka.
Whatever the pipeline does on top of this costs throughput; the walsender's decoding is common to both.

It reads in bulk, and that is what makes it the ceiling. The walsender sends every pgoutput message as a
CopyData of its own (a few hundred bytes), so a reader that is faster than the walsender finds one message in
the socket whenever it looks: waiting in select() until the socket is readable woke this reader once per
message (~160,000 consume_input calls for 200,000 events, 7.2 µs of CPU per event) and capped it at
43,000-50,000 events/s, while the walsender drained the same slot at 88,000-190,000 inserts/s. With
SO_RCVLOWAT (64 KiB) the kernel reports the socket readable only once that much is queued, and each wake-up
reads what is queued until a read comes back short, before waiting again: 0.8 µs per event, 6,400 reads
and 600 waits for 200,000 events, 70,000-110,000 events/s on a busy 2-core VM. The wait is
bounded (``WAIT``), so the last, partial buffer of a stream is read within that time. A Unix socket ignores
SO_RCVLOWAT in select() (82,000 wake-ups for 200,000 events, 3.4 µs per event): there the reader naps
(``NAP``) after a short read instead, less than the socket's buffer takes to fill, so the walsender never
waits for it (1.4 µs per event, 2,200 waits).

Run it in its own process (``python -m tests.bench.bare_reader``, the DSN in ``CDC_DATABASE_URL``), as the
relays run: its CPU time (all its threads) and its peak RSS (VmHWM) are then its own, not the bench's. It
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time
from typing import Any

import psycopg
from psycopg import pq

from cdc.stream.source import pgoutput_options, quote_ident, quote_literal
from tests.bench.db import transport
from tests.bench.procs import cpu_seconds, vmhwm_mb

PG_EPOCH_OFFSET_US = 946_684_800_000_000
_STATUS = struct.Struct(">cQQQqB")
STATUS_INTERVAL = 10.0
RCVLOWAT = 64 * 1024
# libpq reads into a buffer of 16 KiB (more once a message needs it): a read that brought at least this much
# probably left more in the socket, so read again before waiting.
FULL_READ = 8 * 1024
WAIT = 0.01
NAP = 0.0005


def _status(pgconn: pq.abc.PGconn, lsn: int, reply: bool = False) -> None:
    now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
    pgconn.put_copy_data(_STATUS.pack(b"r", lsn, lsn, lsn, now, reply))
    pgconn.flush()


def read_inserts(dsn: str, *, slot: str, publication: str, count: int, timeout: float) -> dict[str, Any]:
    """Stream ``slot`` until ``count`` Insert messages were read; return times, CPU and sizes.

    ``first_insert_ms`` and ``last_insert_ms`` are wall-clock times (ms) of the first and the last Insert
    read, the bare reader's arrivals; ``cpu_first_s`` / ``cpu_last_s`` this process's CPU time at those two
    moments; ``walsender_cpu_s`` all its walsender spent from its start to the last Insert."""
    started = time.monotonic()
    conn = psycopg.connect(dsn, replication="database", autocommit=True, connect_timeout=10)
    try:
        pgconn = conn.pgconn
        walsender_pid = pgconn.backend_pid
        options = pgoutput_options(conn.info.server_version, publication)
        opts = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options.items())
        pgconn.send_query(f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL 0/0 ({opts})".encode())
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise RuntimeError(f"START_REPLICATION failed: {pgconn.get_error_message()!r}")
        streaming = time.monotonic()
        sock = pgconn.socket
        # fromfd() duplicates the descriptor; the option is the socket's, so it holds for libpq's too.
        via = transport(conn.info.host)
        with socket.fromfd(sock, socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)
        nap = NAP if via == "unix" else 0.0
        get_copy_data = pgconn.get_copy_data
        consume_input = pgconn.consume_input
        deadline = streaming + timeout
        inserts = messages = wire_bytes = keepalives = waits = reads = 0
        read_bytes = 0  # since the last socket read
        last_lsn = 0
        last_status = streaming
        first: tuple[float, float, float | None] | None = None
        while inserts < count:
            nbytes, data = get_copy_data(1)
            if nbytes > 0:
                messages += 1
                read_bytes += nbytes
                tag = data[0]
                if tag == 0x77:  # 'w' XLogData: 24 bytes of envelope, then one pgoutput message
                    if data[25] == 0x49:  # 'I'
                        inserts += 1
                        if first is None:
                            first = (time.time() * 1000, time.process_time(), cpu_seconds(walsender_pid))
                    if messages & 0xFFF == 0:
                        last_lsn = int.from_bytes(data[1:9], "big")
                elif tag == 0x6B:  # 'k' primary keepalive: wal_end, send time, reply requested
                    keepalives += 1
                    last_lsn = max(last_lsn, int.from_bytes(data[1:9], "big"))
                    if data[17]:
                        _status(pgconn, last_lsn)
                        last_status = time.monotonic()
            elif nbytes == 0:
                wire_bytes += read_bytes
                reads += 1
                if read_bytes >= FULL_READ:
                    read_bytes = 0
                    consume_input()
                    continue
                read_bytes = 0
                now = time.monotonic()
                if now > deadline:
                    raise TimeoutError(f"bare reader: {inserts} of {count} inserts after {timeout:g} s")
                if now - last_status >= STATUS_INTERVAL:
                    _status(pgconn, last_lsn)
                    last_status = now
                waits += 1
                if nap:
                    time.sleep(nap)
                select.select([sock], [], [], WAIT)
                consume_input()
            else:
                raise RuntimeError(f"the server ended the stream: {pgconn.get_error_message()!r}")
        last = (time.time() * 1000, time.process_time(), cpu_seconds(walsender_pid))
        done = time.monotonic()
        wire_bytes += read_bytes
        _status(pgconn, last_lsn)
    finally:
        conn.close()
    assert first is not None
    return {
        "events": inserts,
        "transport": via,
        "seconds": round(done - started, 3),
        "connect_seconds": round(streaming - started, 3),
        "first_insert_ms": first[0],
        "last_insert_ms": last[0],
        "cpu_first_s": first[1],
        "cpu_last_s": last[1],
        "walsender_cpu_at_first_s": first[2],
        "walsender_cpu_s": last[2],
        "walsender_pid": walsender_pid,
        "peak_rss_mb": vmhwm_mb(os.getpid()),
        "copydata_messages": messages,
        "copydata_bytes": wire_bytes,
        "keepalives": keepalives,
        "socket_reads": reads,
        "waits": waits,
        "rcvlowat_bytes": RCVLOWAT,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.bare_reader", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True)
    p.add_argument("--count", type=int, required=True, help="Insert messages to read")
    p.add_argument("--timeout", type=float, default=300.0, help="s of streaming before giving up")
    args = p.parse_args(argv)
    dsn = os.environ.get("CDC_DATABASE_URL")
    if not dsn:
        p.error("CDC_DATABASE_URL must be set (the DSN stays out of the command line: it holds a password)")
    result = read_inserts(
        dsn, slot=args.slot, publication=args.publication, count=args.count, timeout=args.timeout
    )
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
