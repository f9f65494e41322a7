"""Throwaway extra PostgreSQL clusters, for the refusals that need a server configured differently from the
stack's: ``replica_cluster`` (``wal_level = replica``, cannot do logical decoding) and ``tight_cluster``
(logical, but a single replication slot and WAL sender); and ``failover_pair``, a primary and its physical
standby that a test may promote.

The server binaries are found like ``stack/stack.sh`` finds them: CDC_STACK_PG_BIN (exported by
``. .stack/env``), else the newest ``/usr/lib/postgresql/<ver>/bin``. The cluster lives in a fresh directory
under /tmp (data, Unix socket and log), listens on 127.0.0.1 at a free port with trust authentication (a
loopback-only test cluster), runs with ``fsync = off`` so that it starts in a second or two, and is stopped
(``pg_ctl stop -m immediate``) and removed at the end of the session, whatever happened. As root, PostgreSQL
runs as the ``postgres`` user, as in the stack.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.plugins.pipeline import free_port, wait_until
from tests.plugins.services import service_missing

PG_SUPERUSER = "postgres"
START_ATTEMPTS = 3


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<ver>/bin/initdb: sort like `sort -V` on <ver>.
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.parent.name))


def pg_bindir() -> Path | None:
    """The directory of initdb / pg_ctl, or None when the server binaries are not installed."""
    configured = os.environ.get("CDC_STACK_PG_BIN")
    if configured and (Path(configured) / "initdb").is_file():
        return Path(configured)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version_key)
    return found[-1].parent if found else None


def _is_root() -> bool:
    return os.geteuid() == 0


def _as_pg(args: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a server binary, as the `postgres` user when we are root (PostgreSQL refuses to run as root)."""
    command = ["runuser", "-u", PG_SUPERUSER, "--", *args] if _is_root() else args
    return subprocess.run(
        command, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Cluster:
    def __init__(self, bindir: Path, base: Path, settings: dict[str, str]) -> None:
        self.bindir = bindir
        self.base = base
        self.settings = settings
        self.data = base / "data"
        self.log = base / "postgres.log"
        self.port = 0

    def initdb(self) -> None:
        done = _as_pg(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                PG_SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        if done.returncode != 0:
            pytest.fail(f"initdb of a test cluster failed:\n{done.stdout}\n{done.stderr}")
        (self.data / "pg_hba.conf").write_text(
            "# throwaway test cluster on loopback: trust\n"
            "local   all   all                  trust\n"
            "host    all   all   127.0.0.1/32   trust\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# --- outbox CDC test cluster ---\n"
                + "".join(f"{key} = {value}\n" for key, value in self.settings.items())
                + "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.base}'\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "max_connections = 20\n"
                "log_min_messages = warning\n"
            )

    def start(self, port: int) -> subprocess.CompletedProcess[str]:
        self.port = port
        pg_ctl = str(self.bindir / "pg_ctl")
        return _as_pg(
            [pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", f"-p {port}", "-w", "-t", "30", "start"]
        )

    def start_on_a_free_port(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            started = self.start(free_port())
            if started.returncode == 0:
                return
            log = _tail(self.log)
            self.stop()
            # Another process may have taken the free port between the probe and the bind: try another one.
            if attempt == START_ATTEMPTS or "already in use" not in log:
                pytest.fail(
                    f"a test cluster ({self.settings}) did not start (pg_ctl exit {started.returncode}):\n"
                    f"{started.stderr}\n{log}"
                )

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        done = _as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        if done.returncode == 0:
            return
        # pg_ctl could not stop it: signal the postmaster this fixture started (its pid is in postmaster.pid).
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGQUIT)


@contextlib.contextmanager
def extra_cluster(*, xid_epoch: int = 0, **settings: str) -> Iterator[str]:
    """A fresh local cluster with these postgresql.conf settings; yields its DSN (superuser, trust).
    ``xid_epoch``: the epoch of its transaction ids (pg_resetwal -e), as if 2^32 transactions had run that
    many times."""
    bindir = pg_bindir()
    if bindir is None or not (bindir / "pg_ctl").is_file():
        service_missing(
            "PostgreSQL's server binaries are missing "
            "(no CDC_STACK_PG_BIN, no /usr/lib/postgresql/*/bin/initdb)"
        )
        raise AssertionError("unreachable")
    if _is_root() and subprocess.run(["id", PG_SUPERUSER], capture_output=True).returncode != 0:
        service_missing("the 'postgres' system user is missing: as root, PostgreSQL cannot be started")
        raise AssertionError("unreachable")

    # /tmp is world-executable; the directory itself is the postgres user's, 0755, so that it can hold the
    # data directory (0700, made by initdb), the Unix socket and the log.
    base = Path(tempfile.mkdtemp(prefix="cdc-pgreplica-", dir="/tmp"))
    os.chmod(base, 0o755)
    if _is_root():
        shutil.chown(base, user=PG_SUPERUSER, group=PG_SUPERUSER)
    cluster = _Cluster(bindir, base, settings)
    try:
        cluster.initdb()
        if xid_epoch:
            done = _as_pg([str(bindir / "pg_resetwal"), "-e", str(xid_epoch), "-D", str(cluster.data)])
            if done.returncode != 0:
                pytest.fail(f"pg_resetwal -e {xid_epoch} failed:\n{done.stdout}\n{done.stderr}")
        cluster.start_on_a_free_port()
        yield f"postgresql://{PG_SUPERUSER}@127.0.0.1:{cluster.port}/postgres"
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def replica_cluster() -> Iterator[str]:
    """A cluster running with ``wal_level = replica``: it cannot do logical decoding."""
    with extra_cluster(wal_level="replica") as dsn:
        yield dsn


@pytest.fixture(scope="session")
def tight_cluster() -> Iterator[str]:
    """A logical cluster with room for one replication slot and one WAL sender only."""
    with extra_cluster(wal_level="logical", max_replication_slots="1", max_wal_senders="1") as dsn:
        yield dsn


# -- a primary and its physical standby, for failover slots (PostgreSQL 17+) ---------------------------------

STANDBY_SLOT = "cdc_standby"


@dataclass
class FailoverPair:
    """A primary and a streaming standby of it, each on its own port. The standby is a cold copy of the
    stopped primary's data directory (the server binaries of zonky's releases hold no pg_basebackup, and
    Debian's does not back up a newer server), set up to synchronize failover slots: ``primary_slot_name``,
    ``hot_standby_feedback``, ``sync_replication_slots``; the primary lists the standby's physical slot in
    ``synchronized_standby_slots``."""

    primary: _Cluster
    standby: _Cluster

    def dsn(self, cluster: _Cluster) -> str:
        return f"postgresql://{PG_SUPERUSER}@127.0.0.1:{cluster.port}/postgres"

    @property
    def multi_host_dsn(self) -> str:
        """Both servers, the writable one chosen at each connection: what follows a promotion."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} user={PG_SUPERUSER} "
            "dbname=postgres target_session_attrs=read-write"
        )

    def stop_primary(self) -> None:
        """A clean stop: its walsenders hand the standby every WAL record before they exit."""
        done = _as_pg(
            [str(self.primary.bindir / "pg_ctl"), "-D", str(self.primary.data), "-m", "fast", "-w", "stop"]
        )
        assert done.returncode == 0, done.stderr

    def promote_standby(self) -> None:
        done = _as_pg([str(self.standby.bindir / "pg_ctl"), "-D", str(self.standby.data), "-w", "promote"])
        assert done.returncode == 0, done.stderr


def _write_as_pg(path: Path, text: str, *, append: bool = False) -> None:
    with path.open("a" if append else "w") as out:
        out.write(text)
    if _is_root():
        shutil.chown(path, user=PG_SUPERUSER, group=PG_SUPERUSER)


@contextlib.contextmanager
def standby_pair(
    *, failover_slots: bool, before_copy: Callable[[str], None] | None = None
) -> Iterator[FailoverPair]:
    """A primary and a streaming standby of it. ``failover_slots`` (PostgreSQL 17+): the standby syncs the
    primary's failover slots. ``before_copy(primary_dsn)`` runs on the primary before its data directory is
    copied, so that what it makes (an outbox, a logical slot) is in the standby's copy too."""
    bindir = pg_bindir()
    if bindir is None or not (bindir / "pg_ctl").is_file():
        service_missing("PostgreSQL's server binaries are missing (no CDC_STACK_PG_BIN)")
        raise AssertionError("unreachable")
    bases = []
    for role in ("primary", "standby"):
        base = Path(tempfile.mkdtemp(prefix=f"cdc-pg{role}-", dir="/tmp"))
        os.chmod(base, 0o755)
        if _is_root():
            shutil.chown(base, user=PG_SUPERUSER, group=PG_SUPERUSER)
        bases.append(base)
    primary_settings = {
        "wal_level": "logical",
        "max_replication_slots": "10",
        "max_wal_senders": "10",
        "wal_sender_timeout": "10s",
    }
    if failover_slots:
        primary_settings["synchronized_standby_slots"] = f"'{STANDBY_SLOT}'"
    primary = _Cluster(bindir, bases[0], primary_settings)
    standby = _Cluster(bindir, bases[1], {})
    pair = FailoverPair(primary, standby)
    try:
        primary.initdb()
        (primary.data / "pg_hba.conf").write_text(
            "# throwaway test cluster on loopback: trust\n"
            "local   all           all                  trust\n"
            "host    all           all   127.0.0.1/32   trust\n"
            "host    replication   all   127.0.0.1/32   trust\n"
        )
        primary.start_on_a_free_port()
        with psycopg.connect(pair.dsn(primary), autocommit=True) as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
        if before_copy is not None:
            before_copy(pair.dsn(primary))
        primary.stop()  # immediate: the copy below replays from the last checkpoint, as a crash would
        copied = _as_pg(["cp", "-a", str(primary.data), str(standby.data)])
        assert copied.returncode == 0, copied.stderr
        for name in ("postmaster.pid", "postmaster.opts"):
            (standby.data / name).unlink(missing_ok=True)
        shutil.rmtree(standby.data / "pg_replslot" / STANDBY_SLOT, ignore_errors=True)
        primary.start_on_a_free_port()
        _write_as_pg(standby.data / "standby.signal", "")
        # Set after the copy's own postgresql.conf lines, so these win. The promoted standby must not wait
        # for a standby of its own.
        sync = "sync_replication_slots = on\nsynchronized_standby_slots = ''\n" if failover_slots else ""
        _write_as_pg(
            standby.data / "postgresql.auto.conf",
            f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user={PG_SUPERUSER} dbname=postgres'\n"
            f"primary_slot_name = '{STANDBY_SLOT}'\n"
            "hot_standby_feedback = on\n"
            f"{sync}"
            f"unix_socket_directories = '{standby.base}'\n",
            append=True,
        )
        standby.start_on_a_free_port()
        with psycopg.connect(pair.dsn(primary), autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (STANDBY_SLOT,)
                    ).fetchone()
                    == (True,)
                ),
                30,
                "the standby to stream from the primary",
            )
        yield pair
    finally:
        primary.stop()
        standby.stop()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def failover_pair() -> Iterator[FailoverPair]:
    with standby_pair(failover_slots=True) as pair:
        yield pair


# -- a cluster restored from a copy of its data directory (a disk snapshot) ----------------------------------


@dataclass
class RestorableCluster:
    """A cluster that a test can copy (``snapshot()``) and later put back in place (``restore()``), on the
    same port: what an EBS, LVM or ZFS snapshot, or a VM rollback, does to a database. The copy keeps the
    system identifier, the timeline and the replication slots at their position of the moment."""

    cluster: _Cluster

    @property
    def dsn(self) -> str:
        return f"postgresql://{PG_SUPERUSER}@127.0.0.1:{self.cluster.port}/postgres"

    @property
    def _copy(self) -> Path:
        return self.cluster.base / "snapshot"

    def snapshot(self, *, crash: bool = False) -> None:
        """Copy the data directory: after a clean stop, or (``crash``) as a crash-consistent copy would."""
        self._stop(immediate=crash)
        shutil.rmtree(self._copy, ignore_errors=True)
        copied = _as_pg(["cp", "-a", str(self.cluster.data), str(self._copy)])
        assert copied.returncode == 0, copied.stderr
        self._start()

    def restore(self) -> None:
        """Stop the server and start the copy in its place."""
        self.stop()
        shutil.rmtree(self.cluster.data)
        copied = _as_pg(["cp", "-a", str(self._copy), str(self.cluster.data)])
        assert copied.returncode == 0, copied.stderr
        (self.cluster.data / "postmaster.pid").unlink(missing_ok=True)
        self.start()

    def stop(self) -> None:
        self._stop(immediate=False)

    def start(self) -> None:
        self._start()

    def _stop(self, *, immediate: bool) -> None:
        mode = "immediate" if immediate else "fast"
        done = _as_pg(
            [str(self.cluster.bindir / "pg_ctl"), "-D", str(self.cluster.data), "-m", mode, "-w", "stop"]
        )
        assert done.returncode == 0, done.stderr

    def _start(self) -> None:
        started = self.cluster.start(self.cluster.port)
        assert started.returncode == 0, f"{started.stderr}\n{_tail(self.cluster.log)}"


@contextlib.contextmanager
def restorable_cluster(**settings: str) -> Iterator[RestorableCluster]:
    """A fresh logical cluster (``track_commit_timestamp`` on, as the project asks) that a test may snapshot
    and restore."""
    bindir = pg_bindir()
    if bindir is None or not (bindir / "pg_ctl").is_file():
        service_missing("PostgreSQL's server binaries are missing (no CDC_STACK_PG_BIN)")
        raise AssertionError("unreachable")
    base = Path(tempfile.mkdtemp(prefix="cdc-pgrestore-", dir="/tmp"))
    os.chmod(base, 0o755)
    if _is_root():
        shutil.chown(base, user=PG_SUPERUSER, group=PG_SUPERUSER)
    conf = {"wal_level": "logical", "track_commit_timestamp": "on", "wal_sender_timeout": "10s", **settings}
    cluster = _Cluster(bindir, base, conf)
    try:
        cluster.initdb()
        cluster.start_on_a_free_port()
        yield RestorableCluster(cluster)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
