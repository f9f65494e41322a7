"""The ceiling: the least a Python client must do to read the same stream as the pipeline.

START_REPLICATION with the pipeline's own pgoutput options
(``cdc.stream.source.pgoutput_options``), CopyData read
with libpq's copy API the way ``cdc.stream.source`` reads it (``get_copy_data`` in async mode, select() when
empty), Insert messages counted by their first byte, keepalives answered, a status update at the end. No
decoding, no Kafka. Whatever the pipeline does on top of this costs throughput; the walsender's decoding is
common to both.
"""

from __future__ import annotations

import select
import struct
import time
from typing import Any

import psycopg
from psycopg import pq

from cdc.stream.source import pgoutput_options, quote_ident, quote_literal
from tests.bench.procs import cpu_seconds

PG_EPOCH_OFFSET_US = 946_684_800_000_000
_STATUS = struct.Struct(">cQQQqB")
STATUS_INTERVAL = 10.0


def _status(pgconn: pq.abc.PGconn, lsn: int, reply: bool = False) -> None:
    now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
    pgconn.put_copy_data(_STATUS.pack(b"r", lsn, lsn, lsn, now, reply))
    pgconn.flush()


def read_inserts(dsn: str, *, slot: str, publication: str, count: int, timeout: float) -> dict[str, Any]:
    """Stream ``slot`` until ``count`` Insert messages were read; return times, rates and sizes."""
    started = time.monotonic()
    cpu_started = time.thread_time()
    conn = psycopg.connect(dsn, replication="database", autocommit=True, connect_timeout=10)
    try:
        pgconn = conn.pgconn
        walsender_pid = pgconn.backend_pid
        walsender_cpu0 = cpu_seconds(walsender_pid)
        options = pgoutput_options(conn.info.server_version, publication)
        opts = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options.items())
        pgconn.send_query(f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL 0/0 ({opts})".encode())
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise RuntimeError(f"START_REPLICATION failed: {pgconn.get_error_message()!r}")
        streaming = time.monotonic()
        sock = pgconn.socket
        get_copy_data = pgconn.get_copy_data
        deadline = streaming + timeout
        inserts = messages = wire_bytes = keepalives = 0
        last_lsn = 0
        last_status = streaming
        first_insert_at = None
        while inserts < count:
            nbytes, data = get_copy_data(1)
            if nbytes > 0:
                messages += 1
                wire_bytes += nbytes
                tag = data[0]
                if tag == 0x77:  # 'w' XLogData: 24 bytes of envelope, then one pgoutput message
                    if data[25] == 0x49:  # 'I'
                        inserts += 1
                        if first_insert_at is None:
                            first_insert_at = time.monotonic()
                    if messages & 0xFFF == 0:
                        last_lsn = int.from_bytes(data[1:9], "big")
                elif tag == 0x6B:  # 'k' primary keepalive: wal_end, send time, reply requested
                    keepalives += 1
                    last_lsn = max(last_lsn, int.from_bytes(data[1:9], "big"))
                    if data[17]:
                        _status(pgconn, last_lsn)
                        last_status = time.monotonic()
            elif nbytes == 0:
                now = time.monotonic()
                if now > deadline:
                    raise TimeoutError(f"bare reader: {inserts} of {count} inserts after {timeout:g} s")
                if now - last_status >= STATUS_INTERVAL:
                    _status(pgconn, last_lsn)
                    last_status = now
                ready, _, _ = select.select([sock], [], [], 1.0)
                if ready:
                    pgconn.consume_input()
            else:
                raise RuntimeError(f"the server ended the stream: {pgconn.get_error_message()!r}")
        done = time.monotonic()
        walsender_cpu = cpu_seconds(walsender_pid)
        _status(pgconn, last_lsn)
    finally:
        conn.close()
    seconds = done - started
    return {
        "events": inserts,
        "seconds": round(seconds, 3),
        "events_per_s": round(inserts / seconds),
        "streaming_seconds": round(done - streaming, 3),
        "streaming_events_per_s": round(inserts / (done - streaming)),
        "connect_seconds": round(streaming - started, 3),
        "first_insert_after_s": round((first_insert_at or done) - started, 3),
        "copydata_messages": messages,
        "copydata_bytes": wire_bytes,
        "keepalives": keepalives,
        "reader_cpu_seconds": round(time.thread_time() - cpu_started, 2),
        "walsender_cpu_seconds": (
            round(walsender_cpu - walsender_cpu0, 2)
            if walsender_cpu is not None and walsender_cpu0 is not None
            else None
        ),
    }
