"""A native crash leaves a Python stack (issue 45): `cdc run` and a service's IdempotentConsumer killed by
SIGSEGV, as a fault in librdkafka, libpq or the compiled hot path called from Python would, write the
Python stack of every thread where their log lines go, before the process dies of the signal. And every
`cdc` command turns faulthandler on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.children import dying_with_parent
from tests.plugins.pipeline import ROOT, Outbox, PipelineProcess, wait_until

CONSUMER = """
import logging, sys
from cdc.consumer import IdempotentConsumer
from cdc.logs import configure_logging
configure_logging("INFO")
IdempotentConsumer(
    name=sys.argv[1], topics=[sys.argv[2]], handler=lambda conn, event: None, database_url=sys.argv[3],
    bootstrap_servers=sys.argv[4], dlq_topic=sys.argv[5],
).run()
"""


def crashed_with_stack(log: str, where: str) -> None:
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "most recent call first" in log, log[-3000:]
    assert where in log, f"no frame of {where} in the dump:\n{log[-3000:]}"


def without_faulthandler_env(env: dict[str, str]) -> dict[str, str]:
    """The tests turn it on for every child (tests/conftest.py): here the package must do it."""
    return {k: v for k, v in env.items() if k != "PYTHONFAULTHANDLER"}


def test_cdc_run_killed_by_sigsegv_leaves_its_python_stack_in_its_log(outbox: Outbox, tmp_path: Path) -> None:
    proc = PipelineProcess(without_faulthandler_env(outbox.env), tmp_path / "pipeline.log")
    try:
        proc.wait_streaming()
        os.kill(proc.pid, signal.SIGSEGV)
        assert proc.wait(30) == -signal.SIGSEGV
    finally:
        proc.cleanup()
    crashed_with_stack(proc.log(), "cdc/stream/")


def test_a_consumer_killed_by_sigsegv_leaves_its_python_stack(
    outbox: Outbox, pg_database: str, kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic, dlq = topic_factory(), topic_factory()
    log_path = tmp_path / "consumer.log"
    env = without_faulthandler_env(dict(os.environ))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            dying_with_parent(
                [sys.executable, "-c", CONSUMER, "crash-dumps", topic, pg_database, kafka_bootstrap, dlq]
            ),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "subscribed to" in log_path.read_text(errors="replace"), 60, "the consumer")
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGSEGV)
        assert proc.wait(30) == -signal.SIGSEGV
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    crashed_with_stack(log_path.read_text(errors="replace"), "cdc/consumer/session.py")


def test_every_cdc_command_turns_faulthandler_on() -> None:
    code = (
        "import faulthandler\n"
        "from cdc.cli import main\n"
        "assert not faulthandler.is_enabled()\n"
        "try:\n"
        "    main(['config', 'show'], standalone_mode=False)\n"
        "finally:\n"
        "    print('faulthandler', faulthandler.is_enabled())\n"
    )
    env = {k: v for k, v in without_faulthandler_env(dict(os.environ)).items() if not k.startswith("CDC_")}
    env["CDC_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/nothing"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "faulthandler True"
