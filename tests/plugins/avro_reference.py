"""The Java reference of ``cdc schemas check``: Apache Avro's own verdicts on (old, new) schema pairs.

stack/avro-reference is a small program on ``org.apache.avro:avro`` (Java). The session fixture builds it
with ``stack/stack.sh avro-reference`` (Maven, cached under .stack/avro-reference: a rebuild only when its
pom or source changed) and returns a function that sends every pair to one JVM and reads the verdicts back.
Without Java or Maven a developer's run skips the tests that need it, with the reason; under CI=true that is
a failure, like a missing service.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.services import service_missing

ROOT = Path(__file__).resolve().parents[2]
MAIN_CLASS = "outbox.cdc.reference.Verdicts"

Verdicts = Callable[[Sequence[tuple[str, str, str]]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="session")
def avro_reference() -> Verdicts:
    """``verdicts([(id, old text, new text), ...])`` -> ``{id: {"old", "new", "backward", "forward"}}``."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            service_missing(f"the Avro reference needs {tool}, which is not installed (stack/avro-reference)")
    built = subprocess.run(
        ["bash", str(ROOT / "stack" / "stack.sh"), "avro-reference"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if built.returncode != 0:
        service_missing(
            f"stack/stack.sh avro-reference failed: {(built.stderr or built.stdout).strip()[-2000:]}"
        )
    build = Path(os.environ.get("CDC_STACK_DIR", ROOT / ".stack")) / "avro-reference" / "build"
    classpath = f"{build / 'classes'}{os.pathsep}{build / 'lib' / '*'}"

    def verdicts(pairs: Sequence[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
        lines = "".join(json.dumps({"id": i, "old": old, "new": new}) + "\n" for i, old, new in pairs)
        ran = subprocess.run(
            ["java", "-Xss8m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath, MAIN_CLASS],
            input=lines,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert ran.returncode == 0, f"the Avro reference failed: {ran.stderr[-2000:]}"
        out = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
        assert len(out) == len(pairs), f"{len(pairs)} pairs in, {len(out)} verdicts out: {ran.stderr[-2000:]}"
        return {v["id"]: v for v in out}

    return verdicts
