"""The replication connection: checks before streaming, START_REPLICATION, CopyData in, status updates out.

Two connections are used. A short-lived ordinary one runs the pre-flight checks (``wal_level``, the slot, the
publication) so that a refusal is plain and nothing is touched. The long-lived one is a psycopg connection
with ``replication="database"``; after ``START_REPLICATION`` it is driven through libpq's copy API
(``pgconn.get_copy_data`` in async mode), waiting on the socket with a timeout so that the pipeline can serve
Kafka callbacks and status updates while the database is quiet.

The source never decodes pgoutput and never decides what to confirm: it hands out raw CopyData messages and
sends the LSNs it is told to.
"""

from __future__ import annotations

import logging
import select
import time
from typing import Any

import psycopg
from psycopg import pq

from cdc.errors import (
    SlotActiveError,
    SlotMissingError,
    SourceConnectionError,
    first_line,
    format_lsn,
    parse_lsn,
)
from cdc.pg import connect_replication
from cdc.stream.identity import ServerIdentity, TimelineSwitch, parse_timeline_history
from cdc.stream.pgoutput import standby_status_update

log = logging.getLogger("cdc.source")

# How many CopyData messages one read() hands out at most: large enough to amortise the wait, small enough
# that Kafka callbacks and status updates are served in between.
MAX_BATCH = 500


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def pgoutput_options(server_version: int, publication: str) -> dict[str, str]:
    """pgoutput options for this server: the highest protocol it speaks, and logical messages where known.

    Streaming of in-progress transactions is left off on purpose: it would hand us changes of transactions
    that may still abort, and guarantee 1 says rolled-back inserts never reach Kafka.
    """
    if server_version >= 160000:
        proto = "4"
    elif server_version >= 150000:
        proto = "3"
    elif server_version >= 140000:
        proto = "2"
    else:
        proto = "1"
    options = {"proto_version": proto, "publication_names": quote_ident(publication)}
    if server_version >= 140000:
        options["messages"] = "true"
    return options


def _answer(pgconn: pq.abc.PGconn, timeout: float, what: str) -> pq.abc.PGresult | None:
    """The next result of the command sent, waiting at most ``timeout`` seconds for the server: a blocking
    get_result() would wait for ever on a connection that went silent."""
    deadline = time.monotonic() + timeout
    try:
        while pgconn.is_busy():
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceConnectionError(f"{what}: no answer from PostgreSQL within {timeout:g} s")
            ready, _, _ = select.select([pgconn.socket], [], [], left)
            if ready:
                pgconn.consume_input()
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"{what}: {first_line(exc)}") from exc
    return pgconn.get_result()


def command(pgconn: pq.abc.PGconn, text: str, timeout: float) -> pq.abc.PGresult:
    """A replication command (simple query protocol only) that returns rows, bounded by ``timeout``; its
    failure a SourceConnectionError."""
    what = text.split()[0]
    try:
        pgconn.send_query(text.encode())
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"{what}: {first_line(exc)}") from exc
    result = _answer(pgconn, timeout, what)
    while _answer(pgconn, timeout, what) is not None:
        pass  # the end of the command's results
    if result is None or result.status != pq.ExecStatus.TUPLES_OK:
        message = "no result" if result is None else _result_error(result)
        raise SourceConnectionError(f"{what} failed: {message}")
    return result


def identify(conn: psycopg.Connection[Any], timeout: float) -> ServerIdentity:
    """``IDENTIFY_SYSTEM`` on a replication connection, and the timeline's history past timeline 1: the WAL
    history that the LSNs of this session belong to."""
    pgconn = conn.pgconn
    result = command(pgconn, "IDENTIFY_SYSTEM", timeout)
    system_id, timeline, flushed = (result.get_value(0, n) or b"" for n in range(3))
    tli = int(timeline)
    history: tuple[TimelineSwitch, ...] = ()
    if tli > 1:
        content = command(pgconn, f"TIMELINE_HISTORY {tli}", timeout).get_value(0, 1) or b""
        if content.startswith(b"\\x"):  # bytea in text form, should a server send it so
            content = bytes.fromhex(content[2:].decode())
        history = parse_timeline_history(content)
    return ServerIdentity(system_id.decode(), tli, parse_lsn(flushed.decode()), history)


def server_identity(dsn: str, timeout: float) -> ServerIdentity:
    """:func:`identify` on a replication connection of its own (for the commands: status, teardown)."""
    with connect_replication(dsn, silence=timeout) as conn:
        return identify(conn, timeout)


class ReplicationSource:
    """One streaming session on a slot. Not reusable: after an error, make a new one.

    Silence is a failure: when the server has sent nothing for a third of ``silence`` seconds, a status
    update asks it for a reply (a walsender answers at once with a keepalive); when nothing has come for
    ``silence`` seconds, :meth:`read` raises SourceConnectionError, as for a closed connection. A connection
    that a NAT, a proxy or a paused VM froze is replaced like one the server ended."""

    def __init__(self, dsn: str, *, slot: str, publication: str, silence: float = 30.0) -> None:
        self._dsn = dsn
        self._slot = slot
        self._publication = publication
        self.silence = silence
        self._conn: psycopg.Connection[Any] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._sock = -1
        self.last_status_at = 0.0
        self.last_message_at = time.monotonic()  # when the server last sent anything
        self._pinged = False  # a reply was asked for since the last message
        self._status = (0, 0)  # the last (written, flushed) sent
        self.identity: ServerIdentity | None = None
        self.backend_pid: int | None = None

    def start(self) -> None:
        """Open the replication connection and start streaming from the slot's confirmed position."""
        conn = connect_replication(self._dsn, silence=self.silence)
        self._conn = conn
        pgconn = conn.pgconn
        try:
            self.identity = identify(conn, self.silence)
        except SourceConnectionError:
            self.close()
            raise
        options = pgoutput_options(conn.info.server_version, self._publication)
        opts = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options.items())
        # 0/0: the server starts at the slot's confirmed_flush_lsn, the only position we ever trust.
        command = f"START_REPLICATION SLOT {quote_ident(self._slot)} LOGICAL 0/0 ({opts})"
        try:
            pgconn.send_query(command.encode())
            result = _answer(pgconn, self.silence, "START_REPLICATION")
        except (SourceConnectionError, psycopg.OperationalError) as exc:
            self.close()
            if isinstance(exc, SourceConnectionError):
                raise
            raise SourceConnectionError(f"START_REPLICATION: {first_line(exc)}") from exc
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = pgconn.get_error_message() if result is None else _result_error(result)
            sqlstate = None if result is None else result.error_field(pq.DiagnosticField.SQLSTATE)
            self.close()
            if sqlstate == b"55006":
                raise SlotActiveError(
                    f"replication slot '{self._slot}' is in use by another process: {message}"
                )
            if sqlstate == b"42704":
                raise SlotMissingError(f"replication slot '{self._slot}' does not exist: {message}")
            raise SourceConnectionError(f"START_REPLICATION failed: {message}")
        self._pgconn = pgconn
        self._sock = pgconn.socket
        self.backend_pid = pgconn.backend_pid  # our walsender's, to end it should this connection freeze
        self.last_message_at = time.monotonic()
        log.info("streaming from slot %s (pgoutput proto_version %s)", self._slot, options["proto_version"])

    def read(self, timeout: float) -> list[bytes]:
        """The CopyData messages that are available, waiting up to ``timeout`` seconds for the first."""
        pgconn = self._pgconn
        if pgconn is None:
            raise SourceConnectionError("the replication stream is not started")
        out: list[bytes] = []
        append = out.append
        get_copy_data = pgconn.get_copy_data
        sock = [self._sock]
        wait = timeout
        try:
            while True:
                nbytes, data = get_copy_data(1)
                if nbytes > 0:
                    append(bytes(data))
                    if len(out) >= MAX_BATCH:
                        self.last_message_at = time.monotonic()
                        self._pinged = False
                        return out
                elif nbytes == 0:
                    # libpq's buffer is empty. Keep reading while the socket has more (one socket read is
                    # only a few dozen messages, and every batch costs a poll and a status check); wait
                    # only when there is nothing at all yet.
                    ready, _, _ = select.select(sock, [], [], 0 if out else wait)
                    if not ready:
                        if out:
                            self.last_message_at = time.monotonic()
                            self._pinged = False
                        else:
                            self._mind_the_silence()
                        return out
                    pgconn.consume_input()
                    wait = 0
                else:
                    result = pgconn.get_result()
                    message = "the server ended the stream" if result is None else _result_error(result)
                    raise SourceConnectionError(f"replication stream ended: {message}")
        except psycopg.OperationalError as exc:
            raise SourceConnectionError(f"replication connection lost: {first_line(exc)}") from exc

    def _mind_the_silence(self) -> None:
        silent = time.monotonic() - self.last_message_at
        if silent >= self.silence:
            raise SourceConnectionError(
                f"nothing from PostgreSQL for {silent:.0f} s (source_silence_timeout = {self.silence:g} s), "
                "not even an answer to a request for one: the replication connection is taken for dead"
            )
        if silent >= self.silence / 3 and not self._pinged:
            self._pinged = True
            self.send_status(*self._status, reply=True)

    def send_status(self, written: int, flushed: int, *, reply: bool = False) -> None:
        """Tell the server how far we have received (``written``) and what it may forget (``flushed``)."""
        pgconn = self._pgconn
        if pgconn is None:
            return
        now_us = int(time.time() * 1_000_000)
        message = standby_status_update(written, flushed, flushed, now_us=now_us, reply=reply)
        try:
            pgconn.put_copy_data(message)
            pgconn.flush()
        except psycopg.OperationalError as exc:
            raise SourceConnectionError(
                f"could not send a status update: {first_line(exc)}", lsn=flushed
            ) from exc
        self.last_status_at = time.monotonic()
        self._status = (written, flushed)
        log.debug("status update: written %s, flushed %s", format_lsn(written), format_lsn(flushed))

    def finish(self, timeout: float = 5.0) -> None:
        """End the stream politely: CopyDone, then read (and drop) what the server still sends until it ends
        the COPY too. Closing the socket at once could reset it while the walsender is writing, and the
        walsender would then exit without reading our last status update."""
        pgconn = self._pgconn
        if pgconn is not None:
            deadline = time.monotonic() + timeout
            try:
                pgconn.put_copy_end()
                pgconn.flush()
                while (left := deadline - time.monotonic()) > 0:
                    nbytes, _ = pgconn.get_copy_data(1)
                    if nbytes == -1:
                        while pgconn.get_result() is not None:
                            pass
                        break
                    if nbytes == 0:
                        select.select([self._sock], [], [], min(left, 0.5))
                        pgconn.consume_input()
            except psycopg.OperationalError as exc:
                log.debug("replication connection ended while finishing: %s", first_line(exc))
        self.close()

    def close(self) -> None:
        conn, self._conn, self._pgconn = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:  # the connection is being dropped anyway; nothing left to report
                log.debug("error while closing the replication connection", exc_info=True)


def scalar(conn: psycopg.Connection[Any], query: str, params: tuple[object, ...] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _result_error(result: pq.abc.PGresult) -> str:
    raw = result.error_message
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return text.strip().splitlines()[0] if text.strip() else f"status {result.status}"
