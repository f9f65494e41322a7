"""Apache Avro's Java code as a reader of what `cdc run` publishes: the `avro_java` fixture.

It builds tests/java/avro-decode (Maven, org.apache.avro:avro from Maven Central, Java 17) once into
`.stack/java/avro-decode-<digest of its pom and sources>` and reuses the build while they do not change.
`avro_java.decode(values, schemas_dir, registry=None)` runs it on Kafka record values and returns one JSON
object a value (see AvroDecode.java): the record as Java sees it, its logical types converted with Avro's
own conversions. Without Java 17 or Maven a developer's run skips with the reason; under CI=true that is a
failure, like a missing service.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.services import in_ci

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "java" / "avro-decode"
MAIN_CLASS = "outbox.cdc.interop.AvroDecode"


def _missing(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} (CI=true: the Java interoperability tests must run)", pytrace=False)
    pytest.skip(f"{message} (would fail under CI)")


def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return 0
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _digest() -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in PROJECT.rglob("*") if p.is_file() and "target" not in p.parts):
        h.update(str(path.relative_to(PROJECT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


class AvroJava:
    def __init__(self, java: str, build: Path) -> None:
        self.java, self.build = java, build

    def decode(
        self, values: Sequence[bytes | None], schemas_dir: Path | str, registry: str | None = None
    ) -> list[dict[str, Any]]:
        argv = [self.java, "-cp", f"{self.build / 'avro-decode.jar'}:{self.build / 'lib'}/*", MAIN_CLASS]
        argv += ["--schemas", str(schemas_dir), *(["--registry", registry] if registry else [])]
        stdin = "".join(f"{(v or b'').hex()}\n" for v in values)
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"AvroDecode exited {done.returncode}:\n{done.stderr[-3000:]}"
        lines = done.stdout.splitlines()
        assert len(lines) == len(values), f"AvroDecode answered {len(lines)} of {len(values)}:\n{done.stderr}"
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="session")
def avro_java() -> AvroJava:
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        _missing(f"{'java' if java is None else 'mvn'} is not on PATH (avro-decode needs Java 17, Maven)")
        raise AssertionError("unreachable")
    if (major := _java_major(java)) < 17:
        _missing(f"java is version {major or 'unknown'}; tests/java/avro-decode needs Java 17 or later")
    stack = Path(os.environ.get("CDC_STACK_DIR") or ROOT / ".stack")
    build = stack / "java" / f"avro-decode-{_digest()}"
    if not (build / "avro-decode.jar").is_file():
        build.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed: a run interrupted halfway leaves no build that looks whole.
        work = Path(tempfile.mkdtemp(prefix="avro-decode-", dir=build.parent))
        argv = [mvn, "-q", "-B", "-f", str(PROJECT / "pom.xml"), "package", f"-Ddecoder.build.dir={work}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not (work / "avro-decode.jar").is_file():
            shutil.rmtree(work, ignore_errors=True)
            pytest.fail(f"mvn could not build tests/java/avro-decode:\n{(done.stdout + done.stderr)[-3000:]}")
        try:
            work.rename(build)
        except OSError:  # another run built it first
            shutil.rmtree(work, ignore_errors=True)
    return AvroJava(java, build)
