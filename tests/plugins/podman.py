"""Container fixtures: the image that `make image` built, run with podman on the host's network against the
local stack, as a Kubernetes node would run it.

- `cdc_image`: the image's id (`.stack/image/id`, written by `make image`; `CDC_STACK_IMAGE` names another).
  podman missing, or no image built, is a skip on a developer's machine and a failure under CI=true.
- `containers`: `containers(*cdc_args, env=..., podman_args=...)` starts one container attached, its output
  in a log file under tmp_path (the tail is attached to a failed test's report); every container it started
  is removed at teardown.
- `http_get(port, path)`: the status and body of a probe, or None when nothing answers.
- `container_outbox`: names (slot, publication, table, topics) for a pipeline in a container, as CDC_*
  variables; after `cdc setup` ran in a container, `attach()` gives the Outbox to write events with.

podman uses the project's settings (deploy/image/containers.conf: runc, cgroupfs, no default ulimits).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from cdc.config_loader import load_settings
from tests.plugins.kafka import delete_topics, kafka_security_env
from tests.plugins.pipeline import Outbox, _register, _tail, topic_size
from tests.plugins.services import service_missing

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "deploy" / "image" / "containers.conf"
IMAGE_ID_FILE = ROOT / ".stack" / "image" / "id"


def podman_env() -> dict[str, str]:
    """This process's environment with podman's settings, minus every CDC_* variable (a container's settings
    are given one by one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env=podman_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


@pytest.fixture(scope="session")
def cdc_image() -> str:
    """The id of the image `make image` built (or of CDC_STACK_IMAGE)."""
    if shutil.which("podman") is None:
        service_missing("podman is not installed: run `make image` (deploy/image/image.sh installs it)")
    image = os.environ.get("CDC_STACK_IMAGE", "")
    if not image:
        if not IMAGE_ID_FILE.is_file():
            service_missing(f"no image was built in this checkout (no {IMAGE_ID_FILE}): run `make image`")
        image = IMAGE_ID_FILE.read_text().strip()
    if podman("image", "exists", image, check=False).returncode != 0:
        service_missing(f"the image {image[:19]} is not in podman's storage: run `make image`")
    return image


def http_get(port: int, path: str, timeout: float = 3.0) -> tuple[int, str] | None:
    """(status, body) of GET http://127.0.0.1:<port><path>, or None when nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None


class Container:
    """One `podman run`, attached: the client's exit code is the container's. Stopped the way a kubelet
    stops a container: a signal to its first process (`podman kill --signal`)."""

    def __init__(
        self, argv: list[str], name: str, log_path: Path, what: str, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.what = what
        self.log_path = log_path
        self.argv = argv
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in cleanup()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            env={**podman_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.signalled_at: float | None = None

    def describe(self) -> str:
        rc = self.proc.poll()
        return f"{self.what} container {self.name} ({'running' if rc is None else f'exit code {rc}'})"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def wait_for_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log())
            if match:
                return match
            if not self.alive():
                raise AssertionError(
                    f"the {self.what} container exited with code {self.proc.returncode} before logging "
                    f"{pattern!r}:\n{self.tail()}"
                )
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"the {self.what} did not log {pattern!r} within {timeout:g} s:\n{self.tail()}"
                )
            time.sleep(0.1)

    def signal(self, name: str) -> None:
        """Send SIG<name> to the container's first process (the kubelet's stop: TERM, then KILL)."""
        self.signalled_at = time.monotonic()
        podman("kill", "--signal", name, self.name, check=False)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the {self.what} container did not exit within {timeout:g} s:\n{self.tail()}"
            ) from None

    def cleanup(self) -> None:
        if self.alive():
            podman("rm", "-f", "-t", "0", self.name, check=False, timeout=120)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        podman("rm", "-f", self.name, check=False, timeout=120)
        self._log.close()


StartContainer = Callable[..., Container]


@pytest.fixture
def containers(cdc_image: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartContainer]:
    """`containers(*args, env={}, podman_args=[], image=None, what="cdc")` runs `podman run --rm
    --network=host <podman_args> <env> <image> <args>`. `env` values are passed through podman's own
    environment (`--env NAME`), so that no password shows on a command line."""
    started: list[Container] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        podman_args: list[str] | tuple[str, ...] = (),
        image: str | None = None,
        what: str = "cdc",
    ) -> Container:
        name = f"cdc-test-{uuid.uuid4().hex[:12]}"
        env = env or {}
        argv = ["podman", "run", "--rm", "--name", name, "--network=host", *podman_args]
        for key in env:
            argv += ["--env", key]
        argv += [image or cdc_image, *args]
        log_path = tmp_path / f"{what}-{len(started) + 1}.log"
        # The values reach podman through its environment; `--env NAME` copies each one into the container.
        container = Container(argv, name, log_path, what, env)
        started.append(container)
        _register(request, container)
        return container

    try:
        yield start
    finally:
        for container in started:
            container.cleanup()


# -- an outbox that a container sets up and streams ----------------------------------------------------------


@dataclass
class ContainerOutbox:
    """Names for a pipeline that runs in a container: its settings as CDC_* variables (`env`), its topics,
    and, once `cdc setup` ran, an `Outbox` to write events with (`attach()`)."""

    env: dict[str, str]
    dsn: str
    kafka_bootstrap: str
    box: Outbox | None = None

    def attach(self) -> Outbox:
        """The Outbox of tests.plugins.pipeline over the tables that `cdc setup` made."""
        if self.box is None:
            settings = load_settings(config_file=None, environ=self.env, overrides={})
            self.box = Outbox(
                settings=settings,
                env=self.env,
                dsn=self.dsn,
                conn=psycopg.connect(self.dsn, autocommit=True),
                topic_prefix=settings.topic_template.split(".{", 1)[0],
                dlq_topic=settings.dlq_topic,
                topics=[settings.dlq_topic],
            )
        return self.box

    def topic(self, aggregate_type: str = "order") -> str:
        return self.attach().topic(aggregate_type)

    def published(self, aggregate_type: str = "order") -> int:
        return topic_size(self.kafka_bootstrap, self.topic(aggregate_type))


@pytest.fixture
def container_outbox(
    pg_database: str, kafka_bootstrap: str, kafka_admin: AdminClient, unique_name: Callable[[str], str]
) -> Iterator[ContainerOutbox]:
    """Unique slot, publication, table and topics in the module's database (dropped with it, slots too);
    the topics are deleted after the test."""
    prefix = unique_name("img")
    env = {
        "CDC_DATABASE_URL": pg_database,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "CDC_SLOT": unique_name("slot")[:63],
        "CDC_PUBLICATION": unique_name("pub")[:63],
        "CDC_TABLE": "public." + unique_name("outbox")[:63],
        "CDC_TOPIC_TEMPLATE": prefix + ".{aggregate_type}",
        "CDC_DLQ_TOPIC": unique_name("dlq"),
        **kafka_security_env(kafka_bootstrap),
    }
    holder = ContainerOutbox(env=env, dsn=pg_database, kafka_bootstrap=kafka_bootstrap)
    try:
        yield holder
    finally:
        if holder.box is not None:
            holder.box.conn.close()
            delete_topics(kafka_admin, holder.box.topics)
