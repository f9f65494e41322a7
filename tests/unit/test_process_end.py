"""A `cdc` process ends without a Kafka client's threads running into the interpreter's teardown
(cdc.cli.process_end): a client still alive at exit crashed the process now and then (SIGSEGV in
rdk:broker-1 with TLS), after the command had said all it had to say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cdc.cli.process_end import exit_status, librdkafka_thread_ids, librdkafka_threads

ROOT = Path(__file__).resolve().parents[2]

# A producer that tries a port nothing listens on: its threads run, no broker is needed.
PRELUDE = """
import atexit, gc, sys
from confluent_kafka import Producer
from cdc.cli.process_end import end, librdkafka_threads
atexit.register(lambda: print("atexit ran", flush=True))
def client():
    return Producer({"bootstrap.servers": "127.0.0.1:1", "logger": __import__("logging").getLogger("quiet")})
"""


def ends(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + body], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_a_client_still_open_at_exit_is_named_and_the_process_ends_without_teardown_with_its_code() -> None:
    done = ends("KEPT = client()\nassert librdkafka_threads()\nend(3)\n")
    assert done.returncode == 3, done.stderr
    assert "a Kafka client is still open at exit (threads " in done.stderr and "rdk:main" in done.stderr
    assert "atexit ran" in done.stdout, "the exit functions (logging, tracing) must still run"


def test_a_client_only_a_frozen_cycle_keeps_is_destroyed_by_the_collector_and_the_exit_is_the_usual_one() -> (
    None
):
    body = (
        "class Owner:\n"
        "    def on_error(self, err): pass\n"
        "owner = Owner()\n"
        "owner.producer = Producer({'bootstrap.servers': '127.0.0.1:1', 'error_cb': owner.on_error,\n"
        "                           'logger': __import__('logging').getLogger('quiet')})\n"
        "del owner\n"
        "gc.freeze()\n"
        "assert librdkafka_threads()\n"
        "end(0)\n"
    )
    done = ends(body)
    assert done.returncode == 0, done.stderr
    assert "still open" not in done.stderr and "atexit ran" in done.stdout


def test_without_a_client_the_exit_is_the_interpreters_own() -> None:
    done = ends("end(5)\n")
    assert done.returncode == 5 and done.stderr == "" and "atexit ran" in done.stdout


def test_the_exit_status_of_a_system_exit_is_the_interpreters(capsys) -> None:
    assert exit_status(SystemExit(None)) == 0 and exit_status(SystemExit(2)) == 2
    assert exit_status(SystemExit("cdc: a message")) == 1
    assert capsys.readouterr().err == "cdc: a message\n"


def test_threads_are_read_from_proc_and_none_without_it(tmp_path: Path) -> None:
    for tid, name in ((1, "python"), (2, "rdk:main"), (3, "rdk:broker1")):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
    assert librdkafka_threads(tmp_path) == ["rdk:broker1", "rdk:main"]
    assert librdkafka_thread_ids(tmp_path) == {2: "rdk:main", 3: "rdk:broker1"}
    assert librdkafka_threads(tmp_path / "absent") == []


def test_python_m_cdc_and_the_cdc_script_end_through_it() -> None:
    main = (ROOT / "cdc" / "__main__.py").read_text()
    assert "entry()" in main
    assert 'cdc = "cdc.cli:entry"' in (ROOT / "pyproject.toml").read_text()
