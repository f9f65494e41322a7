"""One Kafka Connect standalone worker (one JVM) running one Debezium connector: start, ask its REST API
whether the connector and its task run, stop (SIGTERM to its process group, SIGKILL after a grace period)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.bench.debezium.config import JVM_OPTIONS, MAIN_CLASS
from tests.children import dying_with_parent

HERE = Path(__file__).resolve().parent
LOG4J_CONFIG = HERE / "log4j2.properties"


class ConnectError(Exception):
    pass


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


class ConnectProcess:
    """``java ... ConnectStandalone worker.properties connector.properties`` in a session of its own (so a
    Ctrl-C in the terminal reaches the bench, which stops it, and so its whole group can be killed)."""

    def __init__(
        self,
        *,
        libs: Path,
        worker_file: Path,
        connector_file: Path,
        log_path: Path,
        rest_port: int,
        name: str,
    ) -> None:
        if port_in_use(rest_port):
            raise ConnectError(
                f"port {rest_port} for Kafka Connect's REST API is taken (choose another with --connect-port)"
            )
        self.name = name
        self.rest_port = rest_port
        self.log_path = log_path
        command = ["java", *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", f"{libs}/*"]
        command += [MAIN_CLASS, str(worker_file), str(connector_file)]
        self._log = open(log_path, "ab")  # closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            dying_with_parent(command),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def exited(self) -> int | None:
        return self.proc.poll()

    def status(self) -> dict[str, Any] | None:
        """GET /connectors/<name>/status, or None while the REST API does not answer (yet)."""
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{self.name}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                result: dict[str, Any] = json.load(reply)
                return result
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def check(self) -> None:
        """Raise when the JVM exited or the connector or its task failed."""
        code = self.exited()
        if code is not None:
            raise ConnectError(f"Kafka Connect exited with code {code}:\n{self.log_tail()}")
        status = self.status()
        if status is None:
            return
        states = [status.get("connector", {})] + list(status.get("tasks", []))
        for state in states:
            if state.get("state") == "FAILED":
                trace = (state.get("trace") or "").strip().splitlines()
                raise ConnectError(
                    f"connector {self.name} FAILED: {' / '.join(trace[:3]) or 'no trace'}\n{self.log_tail()}"
                )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> dict[str, Any]:
        """SIGTERM to the worker's process group (Connect stops the connector, Debezium closes its
        replication connection), SIGKILL to the group after ``timeout`` s."""
        started = time.monotonic()
        killed = False
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
                killed = True
        else:
            self._signal(signal.SIGKILL)  # anything it left in its group
        if not self._log.closed:
            self._log.close()
        return {
            "exit_code": self.proc.returncode,
            "killed": killed,
            "stop_seconds": round(time.monotonic() - started, 2),
        }

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)  # its own session: the group id is its pid
        except ProcessLookupError:
            pass
