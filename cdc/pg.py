"""PostgreSQL helpers every wing may use: connections that never wait without a bound and whose failure
never shows the DSN, and the batched delete by ``(tableoid, ctid)`` of the prune commands (the outbox,
``processed_events``).

A network can fail silently: a NAT or firewall forgets the connection, a VM is paused, a proxy hangs.
Nothing is closed and nothing comes back. Two bounds meet that on every connection the project opens:

- the kernel's: TCP keepalives and ``tcp_user_timeout`` (libpq parameters, unless the DSN sets them), so
  that a peer that is gone is noticed even while nothing is sent, and unacknowledged data does not wait
  for ``tcp_retries2`` (about 15 minutes);
- ours: every wait for an answer on an ordinary connection (:class:`BoundedConnection`) ends after
  ``query_timeout`` seconds, and the connection is closed. This one also holds against a peer that keeps
  the TCP connection up and forwards nothing (a frozen proxy), which the kernel cannot see.

The replication stream is watched by :mod:`cdc.stream.source` instead: the server must say something
within ``source_silence_timeout``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.errors import AccessDeniedError, SourceConnectionError, first_line

if TYPE_CHECKING:
    from cdc.config import Settings

DEFAULT_QUERY_TIMEOUT = 30.0  # seconds: Settings.query_timeout's default
CONNECT_TIMEOUT = 10  # seconds for libpq to connect (TCP, TLS, authentication)
_RV = TypeVar("_RV")
# psycopg raises this private OperationalError when a wait's timeout expires.
_WAIT_TIMEOUT: type[Exception] = getattr(psycopg.errors, "_WaitTimeout", psycopg.OperationalError)


def database_dsn(settings: Settings) -> str:
    """``database_url``, with the password of ``database_password_file`` or ``database_password_command``
    read now. Called at every (re)connect, so that a rotated secret (a file Kubernetes updates in place) or
    an expiring token (a cloud IAM one, minutes long) is picked up without a restart. The result holds the
    password: it is passed to libpq, never logged."""
    if settings.database_password_file is None and settings.database_password_command is None:
        return settings.database_url
    return make_conninfo(settings.database_url, password=read_password(settings))


def read_password(settings: Settings) -> str:
    """The current password: the file's content or the command's output, without the trailing line break.
    A failure is a SourceConnectionError (retried as a refused connection is), named without the secret."""
    if settings.database_password_file is not None:
        path = Path(settings.database_password_file)
        try:
            password = path.read_text().rstrip("\r\n")
        except OSError as exc:
            raise SourceConnectionError(
                f"cannot read database_password_file {path}: {exc.strerror or exc}"
            ) from exc
        if not password:
            raise SourceConnectionError(f"database_password_file {path} is empty")
        return password
    command = settings.database_password_command
    assert command is not None
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=settings.query_timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SourceConnectionError(
            f"database_password_command did not finish within {settings.query_timeout:g} s (query_timeout)"
        ) from exc
    except OSError as exc:
        raise SourceConnectionError(f"database_password_command could not run: {exc}") from exc
    password = done.stdout.rstrip("\r\n")
    if done.returncode != 0 or not password:
        # Its stderr, not its stdout: what it printed there may be the secret.
        why = done.stderr.strip().splitlines()[0] if done.stderr.strip() else "no output"
        raise SourceConnectionError(f"database_password_command exited {done.returncode}: {why[:300]}")
    return password


def silence_params(dsn: str, seconds: float) -> dict[str, Any]:
    """libpq's TCP keepalives and ``tcp_user_timeout`` for a bound of ``seconds`` on a silent peer: idle
    for a third of it, then three probes; the DSN's own values win."""
    idle = max(1, int(seconds / 3))
    params: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": max(1, idle // 3),
        "keepalives_count": 3,
        "tcp_user_timeout": int(seconds * 1000),
    }
    given = conninfo_to_dict(dsn)
    return {key: value for key, value in params.items() if key not in given}


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server ends after ``wait_timeout`` seconds: then it
    is closed, and the wait raises ``psycopg.OperationalError``, as a lost connection does."""

    wait_timeout: float | None = DEFAULT_QUERY_TIMEOUT

    def wait(self, gen: Generator[Any, Any, _RV], interval: float = 0.1, timeout: float | None = None) -> _RV:
        bound = self.wait_timeout if timeout is None else timeout
        try:
            return super().wait(gen, interval, bound)
        except _WAIT_TIMEOUT as exc:
            self.pgconn.finish()  # the protocol state is unknown: nothing more may be sent on it
            raise psycopg.OperationalError(
                f"PostgreSQL did not answer within {bound:g} s (query_timeout); the connection is closed"
            ) from exc


def connect(dsn: str, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> psycopg.Connection[Any]:
    """An autocommit connection whose waits end after ``timeout`` seconds (None: only the kernel's
    bound), connecting too, its failure a SourceConnectionError."""
    try:
        conn = BoundedConnection.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(2, min(CONNECT_TIMEOUT, int(timeout or CONNECT_TIMEOUT))),
            **silence_params(dsn, timeout or DEFAULT_QUERY_TIMEOUT),
        )
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"cannot connect to PostgreSQL: {first_line(exc)}") from exc
    conn.wait_timeout = timeout
    return conn


def connect_replication(dsn: str, *, silence: float) -> psycopg.Connection[Any]:
    """A replication connection (``replication=database``): its commands are driven through libpq by the
    caller, which bounds them (:func:`cdc.stream.source.command`); the kernel notices a peer gone after
    ``silence`` seconds."""
    try:
        return psycopg.connect(
            dsn,
            replication="database",
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            **silence_params(dsn, silence),
        )
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"cannot open a replication connection: {first_line(exc)}") from exc


def tracks_commit_timestamps(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server keeps each transaction's commit time (``track_commit_timestamp``): what
    `cdc recover` chooses rows by, and `cdc outbox prune` notes."""
    row = conn.execute("SELECT current_setting('track_commit_timestamp')::bool").fetchone()
    return bool(row and row[0])


# Deletes the rows of the CTE ``old`` (``rel``: tableoid, ``tid``: ctid), which the statement locked. A ctid
# names a row only within one partition: on a partitioned table (README, "Keeping the outbox small"), a
# ``ctid = ANY`` alone also matches the young rows of other partitions at the same ctids, so the partition is
# matched too. The ``ctid = ANY`` stays for its plan: a TID scan of each partition, where the planner may
# answer a join on ctid with a scan of the whole table.
DELETE_LOCKED = (
    "DELETE FROM {table} WHERE ctid = ANY (ARRAY(SELECT tid FROM old))"
    " AND (tableoid, ctid) IN (SELECT rel, tid FROM old)"
)


def side_write_timeout(query_timeout: float, statement_ms: int) -> float:
    """The client's bound on a side write of the stream's thread: the server's statement timeout and a
    second, at most ``query_timeout``. A frozen connection costs the stream that long, once."""
    return min(query_timeout, statement_ms / 1000 + 1)


def connect_bounded(
    dsn: str, *, statement_ms: int, lock_ms: int, timeout: float | None = DEFAULT_QUERY_TIMEOUT
) -> psycopg.Connection[Any]:
    """:func:`connect`, with every statement and lock wait bounded on the server too: for the pipeline's
    side writes (the heartbeat, the saved position), which run on the stream's only thread. A lock held on
    their table, or a server that hangs, must cost a warning, not the stream."""
    conn = connect(dsn, timeout=timeout)
    try:
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
            (f"{statement_ms}ms", f"{lock_ms}ms"),
        )
    except psycopg.Error:
        conn.close()
        raise
    return conn


# libpq's words for a connection refused because of who we are or how we connect: (words, setting, fix).
# A server that is down or restarting says otherwise, and is waited for.
_ACCESS_REFUSALS: tuple[tuple[str, str, str], ...] = (
    (
        "certificate verify failed",
        "database_url",
        "the server's certificate is not signed by the CA that sslrootcert names: give the CA that signed it "
        "(sslrootcert=/path/to/ca.pem)",
    ),
    (
        "does not match host name",
        "database_url",
        "the server's certificate does not name the host in database_url: connect by a name it holds",
    ),
    (
        "root certificate file",
        "database_url",
        "sslmode=verify-ca or verify-full needs the CA: set sslrootcert=/path/to/ca.pem",
    ),
    (
        "password authentication failed",
        "database_password_file",
        "the server refused the password: check the one in database_url, database_password_file or "
        "database_password_command",
    ),
    (
        "no encryption",
        "database_url",
        "the server accepts this role only over TLS: set sslmode=verify-full and sslrootcert in database_url",
    ),
    (
        "server does not support SSL",
        "database_url",
        "the server has no TLS: lower sslmode in database_url, or turn ssl on in the server",
    ),
    (
        "no pg_hba.conf entry",
        "database_url",
        "the server's pg_hba.conf has no line for this host, role and database (for `cdc run`, also one that "
        "allows replication connections to the database): ask its administrator",
    ),
)


def access_refusal(error: BaseException | None) -> AccessDeniedError | None:
    """The setting to fix when PostgreSQL refused a connection because of who we are or how we connect
    (TLS, the password, pg_hba.conf); None when the refusal may pass (a server that is starting, a network
    that is down). Never shows the DSN: libpq's first line names the host and the role, not the password."""
    while error is not None and not isinstance(error, psycopg.OperationalError):
        error = error.__cause__
    if error is None:
        return None
    text = first_line(error)
    for words, key, fix in _ACCESS_REFUSALS:
        if words in text:
            return AccessDeniedError(f"PostgreSQL refused the connection ({text}): {fix}", key=key)
    return None
