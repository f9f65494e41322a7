"""The soak orphans nothing (issue 45): killed with kill -9 mid-run, its `cdc run`, its consumer and its load
generator die within seconds (they used to go on retrying against a stack that had been stopped)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench.db import connect, drop_database
from tests.children import dying_with_parent
from tests.kafka_admin import delete_groups, delete_topics_with_prefix
from tests.plugins.pipeline import ROOT

SURVIVAL_S = 5.0  # how long a child may outlive the killed soak
SESSION_MS = 6000  # the consumer's session.timeout.ms (the broker's minimum)


def children_of(pid: int) -> set[int]:
    """Every process below ``pid`` (its children, theirs...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.plain("the soak connects without TLS or SASL settings")
def test_the_soak_killed_with_kill_9_leaves_no_process_behind(
    pg_admin_dsn: str, kafka_bootstrap: str, kafka_admin: object, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=pg_admin_dsn, CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)
    command = [sys.executable, "-m", "tests.bench.soak", "--minutes", "2", "--rate", "200"]
    command += ["--prune-older-than", "0", "--output-dir", str(tmp_path)]
    # The killed consumer stays a member of its group until its session times out: then the group can go.
    command += ["--consumer-arg=-X", f"--consumer-arg=session.timeout.ms={SESSION_MS}"]
    soak = subprocess.Popen(
        dying_with_parent(command),
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert soak.stderr is not None
    lines: list[str] = []
    run_id, children = None, set[int]()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # until the load runs: cdc run, the consumer and the loader
            line = soak.stderr.readline()
            if not line:
                break
            lines.append(line)
            if match := re.search(r"set-up: database soak_(\w+),", line):
                run_id = match.group(1)
            if "offering" in line:
                break
        assert run_id is not None and "offering" in lines[-1], "".join(lines[-30:])
        time.sleep(2)
        children = children_of(soak.pid)
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80] for pid in children}
        assert len(children) >= 3, names  # cdc run, the consumer, the loader (and what they start)
        soak.send_signal(signal.SIGKILL)
        soak.wait(10)
        deadline = time.monotonic() + SURVIVAL_S
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: names[pid] for pid in children if alive(pid)}
        assert survivors == {}, f"outlived the soak by {SURVIVAL_S:g} s: {survivors}"
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait(10)
        soak.stderr.close()
        for pid in children:  # a failed test orphans nothing either
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        # What the killed soak could not clean up: its database and slot, its topics and group.
        if run_id is not None:
            with connect(pg_admin_dsn) as admin:
                drop_database(admin, f"soak_{run_id}")
            delete_topics_with_prefix(kafka_admin, f"soak.{run_id}.")  # type: ignore[arg-type]
            delete_groups(kafka_admin, [f"soak_{run_id}_invoices"], members_leave=60)  # type: ignore[arg-type]
