"""The fault suite's own stack: `stack/stack.sh` in a directory and on ports of its own, so that killing its
broker or crashing its PostgreSQL never touches the stack that `make test` uses.

Defaults: ``.stack/faults``, PostgreSQL 26432, Kafka 30092 (controller 30093, advertised 30094: a proxy's),
registry 29081; ``CDC_FAULTS_*`` variables move them (``CDC_FAULTS_KAFKA_PORT`` for ``CDC_STACK_KAFKA_PORT``
of `stack/stack.sh`, and so on; ``CDC_FAULTS_STACK_DIR`` moves the directory).
The broker is started on fresh storage for each run by default, as a newcomer's first `make stack-up` would
be: a new broker is where the idempotent producer meets a coordinator that is still loading.
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


class FaultStack:
    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or Path(os.environ.get("CDC_FAULTS_STACK_DIR", ROOT / ".stack" / "faults"))
        self.script_env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        self.script_env["CDC_STACK_DIR"] = str(self.dir)
        for key, default in PORTS.items():
            self.script_env[key] = os.environ.get(key.replace("CDC_STACK_", "CDC_FAULTS_"), default)

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
        for part, marker in (("kafka/libs", "kafka/libs/.resolved"), ("registry/build", "registry/.built")):
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
        pid = self.kafka_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        self.up()

    def fresh_kafka(self) -> None:
        """Stop the broker if it runs, wipe its storage, start it again: a broker that has never seen a
        producer, a topic or a coordinator."""
        pid = self.kafka_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        shutil.rmtree(self.dir / "kafka" / "data", ignore_errors=True)
        self.up()

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


def _wait_gone(pid: int, timeout: float = 30) -> None:
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
    raise RuntimeError(f"process {pid} is still there {timeout:g} s after kill -9")
