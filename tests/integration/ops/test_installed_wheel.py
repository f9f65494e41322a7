"""outbox-cdc as a user gets it (issue 43, item 3): a wheel built from the tree, installed with pip in a
fresh virtual environment, run from a directory with no checkout in it (its own `schemas/`, no
`slot_setup/`): `cdc setup`, `cdc run`, `cdc status` and `cdc audit` against the stack.

The wheel is built without cargo (the pure-Python path: what `pip install` gives where no Rust toolchain is)
so that the build takes seconds; its dependencies come from PyPI through pip's cache, as `make install`'s
do. About 40 s (marker ``slow``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.plugins.kafka import delete_topics, with_stack_security
from tests.plugins.pipeline import SCHEMAS_DIR, order_placed, topic_size, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def _no_cargo_path() -> str:
    return ":".join(p for p in os.environ["PATH"].split(":") if p and not (Path(p) / "cargo").exists())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ of a fresh virtual environment where the wheel built from this tree is installed."""
    home = tmp_path_factory.mktemp("wheel")
    build_env = {**os.environ, "PATH": _no_cargo_path()}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(home / "dist"), str(ROOT)],
        cwd=home,
        env=build_env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = (home / "dist").glob("outbox_cdc-*.whl")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        cwd=home,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return venv / "bin"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with the user's own schemas and nothing of the checkout."""
    work = tmp_path / "work"
    shutil.copytree(SCHEMAS_DIR, work / "schemas")
    return work


@pytest.fixture
def names(pg_database: str, kafka_bootstrap: str, kafka_admin, unique_name) -> Iterator[dict[str, str]]:
    env = {
        "CDC_DATABASE_URL": pg_database,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "CDC_SLOT": unique_name("slot")[:63],
        "CDC_PUBLICATION": unique_name("pub")[:63],
        "CDC_TABLE": "public." + unique_name("outbox")[:50],
        "CDC_TOPIC_TEMPLATE": unique_name("wheel") + ".{aggregate_type}",
        "CDC_DLQ_TOPIC": unique_name("dlq"),
        "CDC_STATUS_INTERVAL": "1",
    }
    yield env
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND NOT active",
            (env["CDC_SLOT"],),
        )
    delete_topics(
        kafka_admin, [env["CDC_TOPIC_TEMPLATE"].format(aggregate_type="order"), env["CDC_DLQ_TOPIC"]]
    )


def run_env(names: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "PYTHON", "VIRTUAL_ENV"))}
    return with_stack_security({**env, **names, "PYTHONUNBUFFERED": "1"})


def test_the_installed_wheel_sets_up_runs_reports_and_audits_outside_a_checkout(installed, workdir, names):
    env = run_env(names)

    def cdc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(installed / "cdc"), *args],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )

    where = subprocess.run(
        [str(installed / "python"), "-c", "import cdc, sys; print(cdc.__file__); print(sys.path)"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(installed.parent)) and str(ROOT) not in where, where
    assert not (workdir / "slot_setup").exists() and not (workdir / "pyproject.toml").exists()

    setup = cdc("setup")
    assert setup.returncode == 0, setup.stderr
    assert f"slot {names['CDC_SLOT']}" in setup.stdout, setup.stdout

    log_path = workdir.parent / "run.log"
    with open(log_path, "wb") as log:
        run = subprocess.Popen(
            [str(installed / "cdc"), "run"],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(
            lambda: "streaming from slot" in log_path.read_text() or run.poll() is not None,
            60,
            "cdc run to stream",
        )
        assert run.poll() is None, log_path.read_text()[-3000:]
        table = sql.Identifier(*names["CDC_TABLE"].split("."))
        with psycopg.connect(names["CDC_DATABASE_URL"], autocommit=True) as conn:
            with conn.transaction():
                for i in range(20):
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version,"
                            " payload) VALUES (gen_random_uuid(), 'order', %s, 'OrderPlaced', 1, %s)"
                        ).format(table),
                        (f"o-{i % 4}", Jsonb(order_placed(f"o-{i}"))),
                    )
                committed = conn.execute("SELECT now()").fetchone()  # the transaction's start
                assert committed is not None
            topic = names["CDC_TOPIC_TEMPLATE"].format(aggregate_type="order")
            wait_until(lambda: topic_size(names["CDC_KAFKA_BOOTSTRAP_SERVERS"], topic) == 20, 60, "20 events")
            wait_until(
                lambda: (
                    (
                        row := conn.execute(
                            "SELECT commit_time FROM public.cdc_checkpoint WHERE slot = %s",
                            (names["CDC_SLOT"],),
                        ).fetchone()
                    )
                    is not None
                    and row[0] is not None
                    and row[0] >= committed[0]
                ),
                60,
                "the saved position past the events",
            )

        status = cdc("status")
        assert status.returncode == 0, status.stderr
        assert names["CDC_SLOT"] in status.stdout, status.stdout

        time.sleep(1)
        audit = cdc("audit", "--since", "1h")
        assert audit.returncode == 0, audit.stdout + audit.stderr
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        code = run.wait(60)
    assert code == 0, log_path.read_text()[-3000:]
