"""Throwaway extra PostgreSQL clusters, for the refusals that need a server configured differently from the
stack's: ``replica_cluster`` (``wal_level = replica``, cannot do logical decoding) and ``tight_cluster``
(logical, but a single replication slot and WAL sender).

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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.pipeline import free_port
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
def extra_cluster(**settings: str) -> Iterator[str]:
    """A fresh local cluster with these postgresql.conf settings; yields its DSN (superuser, trust)."""
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
        for attempt in range(1, START_ATTEMPTS + 1):
            started = cluster.start(free_port())
            if started.returncode == 0:
                break
            log = _tail(cluster.log)
            cluster.stop()
            # Another process may have taken the free port between the probe and the bind: try another one.
            if attempt == START_ATTEMPTS or "already in use" not in log:
                pytest.fail(
                    f"a test cluster ({settings}) did not start (pg_ctl exit {started.returncode}):\n"
                    f"{started.stderr}\n{log}"
                )
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
