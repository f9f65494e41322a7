"""The fault suite's own stack: `stack/stack.sh` in a directory and on ports of its own, so that killing its
broker or crashing its PostgreSQL never touches the stack that `make test` uses.

Defaults: ``.stack/faults``, PostgreSQL 26432, Kafka 30092 (controller 30093, advertised 30094: a proxy's),
registry 29081; ``CDC_FAULTS_*`` variables move them (``CDC_FAULTS_KAFKA_PORT`` for ``CDC_STACK_KAFKA_PORT``
of `stack/stack.sh`, and so on; ``CDC_FAULTS_STACK_DIR`` moves the directory).
The broker is started on fresh storage for each run by default, as a newcomer's first `make stack-up` would
be: a new broker is where the idempotent producer meets a coordinator that is still loading.

``brokers=3`` (``--brokers 3``) is the three-broker cluster of `stack/cluster.sh` instead, in
``.stack/faults-cluster`` and on ports of its own (PostgreSQL 26532, brokers 30192/30202/30212, controller
30193, registry 29181; the same ``CDC_FAULTS_*`` variables move them), so that it runs beside the single
broker's fault stack. Its clients connect to the brokers directly: no proxy, no silences of the broker.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACK_SCRIPT = ROOT / "stack" / "stack.sh"

PORTS = {
    "CDC_STACK_PG_PORT": "26432",
    "CDC_STACK_KAFKA_PORT": "30092",
    "CDC_STACK_KAFKA_CONTROLLER_PORT": "30093",
    "CDC_STACK_REGISTRY_PORT": "29081",
    # The broker advertises this port, where the suite's proxy listens (`tests/faults/run.py`): every client
    # connection, the bootstrap's too, goes through it, so that the suite can freeze them.
    "CDC_STACK_KAFKA_ADVERTISED_PORT": "30094",
}


CLUSTER_PORTS = {
    "CDC_STACK_PG_PORT": "26532",
    "CDC_STACK_KAFKA_PORT": "30192",
    "CDC_STACK_KAFKA_CONTROLLER_PORT": "30193",
    "CDC_STACK_REGISTRY_PORT": "29181",
}
BROKER_NODES = ("b1", "b2", "b3")
# A controlled shutdown moves the broker's leaderships away first: it may take a while on a loaded machine.
STOP_TIMEOUT = 60.0


class FaultStack:
    def __init__(self, directory: Path | None = None, brokers: int = 1) -> None:
        self.brokers = brokers
        default_dir = ROOT / ".stack" / ("faults" if brokers == 1 else "faults-cluster")
        self.dir = directory or Path(os.environ.get("CDC_FAULTS_STACK_DIR", default_dir))
        self.script_env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        self.script_env["CDC_STACK_DIR"] = str(self.dir)
        for key, default in (PORTS if brokers == 1 else CLUSTER_PORTS).items():
            self.script_env[key] = os.environ.get(key.replace("CDC_STACK_", "CDC_FAULTS_"), default)
        if brokers != 1:
            self.script_env["CDC_STACK_KAFKA_BROKERS"] = str(brokers)

    # -- the stack script ---------------------------------------------------------------------------------

    def _script(self, command: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            ["bash", str(STACK_SCRIPT), command],
            env=self.script_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"stack.sh {command} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def up(self) -> None:
        self._borrow_builds()
        self._script("up")

    def _borrow_builds(self) -> None:
        """The Kafka jars and the registry build of the main stack, hard-linked, when this stack has none yet:
        the same poms, so `stack.sh` takes them as its own instead of resolving and building them again."""
        main = ROOT / ".stack"
        # (what to link, the marker stack.sh compares with the poms' hash): the registry's own directory also
        # holds its transaction log, which must not be shared, so only its build is linked.
        builds = [("kafka/libs", "kafka/libs/.resolved"), ("registry/build", "registry/.built")]
        # promtool too, which stack.sh would otherwise fetch with apt-get download.
        builds.append(("prometheus", "prometheus/usr/bin/promtool"))
        for part, marker in builds:
            source, target = main / part, self.dir / part
            if (main / marker).exists() and not target.exists() and main.resolve() != self.dir.resolve():
                target.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-al", str(source), str(target)], check=True)
                if not (self.dir / marker).exists():
                    shutil.copy(main / marker, self.dir / marker)

    @property
    def kafka_target(self) -> tuple[str, int]:
        """Where the broker itself listens (clients are told the advertised port, the proxy's)."""
        return ("127.0.0.1", int(self.script_env["CDC_STACK_KAFKA_PORT"]))

    @property
    def kafka_advertised_port(self) -> int:
        return int(self.script_env["CDC_STACK_KAFKA_ADVERTISED_PORT"])

    def down(self) -> None:
        self._script("down")

    def env(self) -> dict[str, str]:
        """The variables `stack.sh up` wrote to <dir>/env (export K='V' lines)."""
        out = {}
        for line in (self.dir / "env").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                out[key] = shlex.split(value)[0] if value else ""
        return out

    # -- Kafka --------------------------------------------------------------------------------------------

    @property
    def kafka_pid_file(self) -> Path:
        return self.dir / "kafka.pid"

    def kafka_pid(self) -> int | None:
        try:
            pid = int(self.kafka_pid_file.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def kill_broker(self) -> None:
        """``kill -9`` of the broker; returns once it is gone (the stack script's pid file stays behind, as
        it would after a crash: `stack.sh up` sees the dead pid and starts a new broker)."""
        pid = self.kafka_pid()
        if pid is None:
            raise RuntimeError("the fault stack's broker is not running")
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)

    def restart_kafka(self) -> None:
        """Stop the broker (kill -9, as the faults do) and start it again on the same storage."""
        if self.brokers != 1:
            self._kill_cluster()
            self.up()
            return
        pid = self.kafka_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        self.up()

    def fresh_kafka(self) -> None:
        """Stop the broker if it runs, wipe its storage, start it again: a broker that has never seen a
        producer, a topic or a coordinator."""
        if self.brokers != 1:
            self._kill_cluster()
            for node in ("ctl", *BROKER_NODES):
                shutil.rmtree(self.dir / "kafka" / f"data-{node}", ignore_errors=True)
            self.up()
            return
        pid = self.kafka_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        shutil.rmtree(self.dir / "kafka" / "data", ignore_errors=True)
        self.up()

    # -- the three-broker cluster -------------------------------------------------------------------------

    def node_pid(self, node: str) -> int | None:
        """The pid of cluster node ``node`` (b1, b2, b3, ctl) when it runs."""
        try:
            pid = int((self.dir / f"kafka-{node}.pid").read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def kill_node(self, node: str) -> None:
        """``kill -9`` of a cluster node; returns once it is gone. `up` starts it again."""
        pid = self.node_pid(node)
        if pid is None:
            raise RuntimeError(f"the fault stack's kafka {node} is not running")
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)

    def stop_node(self, node: str) -> float:
        """SIGTERM (a controlled shutdown), waited for ``STOP_TIMEOUT`` s: the seconds it took."""
        pid = self.node_pid(node)
        if pid is None:
            raise RuntimeError(f"the fault stack's kafka {node} is not running")
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid, STOP_TIMEOUT, what="SIGTERM")
        return time.monotonic() - started

    def node_log(self, node: str) -> Path:
        return self.dir / "logs" / f"kafka-{node}.log"

    def _kill_cluster(self) -> None:
        for node in (*BROKER_NODES, "ctl"):
            pid = self.node_pid(node)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid)

    # -- PostgreSQL ---------------------------------------------------------------------------------------

    def restart_postgres(self) -> None:
        """``pg_ctl restart -m immediate``: every backend dies without a checkpoint, recovery replays WAL."""
        env = self.env()
        base_file = self.dir / "pg-base"
        base = Path(base_file.read_text().strip()) if base_file.exists() else self.dir
        command = [
            f"{env['CDC_STACK_PG_BIN']}/pg_ctl",
            "-D",
            str(base / "pg"),
            "-l",
            str(base / "logs" / "postgres.log"),
            "-m",
            "immediate",
            "-w",
            "-t",
            "120",
            "restart",
        ]
        if os.getuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd="/", timeout=180)


def _wait_gone(pid: int, timeout: float = 30, what: str = "kill -9") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        # A killed child of ours would stay a zombie: reap it if it is one.
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"process {pid} is still there {timeout:g} s after {what}")
