"""Apache Avro's Java code as a reader of what `cdc run` publishes: the `avro_java` fixture.

It builds tests/java/avro-decode (Maven, org.apache.avro:avro from Maven Central, Java 17) once into
`.stack/java/avro-decode-<digest of its pom and sources>` and reuses the build while they do not change
(:func:`build_java_tool`, which the other Java tools of tests/java share).
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


def _digest(project: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in project.rglob("*") if p.is_file() and "target" not in p.parts):
        h.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def build_java_tool(name: str) -> tuple[str, list[str]]:
    """Build tests/java/<name> (its pom takes ``-Dtool.build.dir``) once per digest of its files into
    `.stack/java/<name>-<digest>`; returns the java binary and the class path (<name>.jar and its lib/)."""
    project = ROOT / "tests" / "java" / name
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        missing = "java" if java is None else "mvn"
        _missing(f"{missing} is not on PATH (tests/java/{name} needs Java 17, Maven)")
        raise AssertionError("unreachable")
    if (major := _java_major(java)) < 17:
        _missing(f"java is version {major or 'unknown'}; tests/java/{name} needs Java 17 or later")
    stack = Path(os.environ.get("CDC_STACK_DIR") or ROOT / ".stack")
    build = stack / "java" / f"{name}-{_digest(project)}"
    if not (build / f"{name}.jar").is_file():
        build.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed: a run interrupted halfway leaves no build that looks whole.
        work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=build.parent))
        argv = [mvn, "-q", "-B", "-f", str(project / "pom.xml"), "package", f"-Dtool.build.dir={work}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not (work / f"{name}.jar").is_file():
            shutil.rmtree(work, ignore_errors=True)
            pytest.fail(f"mvn could not build tests/java/{name}:\n{(done.stdout + done.stderr)[-3000:]}")
        try:
            work.rename(build)
        except OSError:  # another run built it first
            shutil.rmtree(work, ignore_errors=True)
    return java, [str(build / f"{name}.jar"), f"{build / 'lib'}/*"]


class AvroJava:
    def __init__(self, java: str, classpath: list[str]) -> None:
        self.java, self.classpath = java, classpath

    def decode(
        self, values: Sequence[bytes | None], schemas_dir: Path | str, registry: str | None = None
    ) -> list[dict[str, Any]]:
        argv = [self.java, "-cp", ":".join(self.classpath), MAIN_CLASS]
        argv += ["--schemas", str(schemas_dir), *(["--registry", registry] if registry else [])]
        stdin = "".join(f"{(v or b'').hex()}\n" for v in values)
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"AvroDecode exited {done.returncode}:\n{done.stderr[-3000:]}"
        lines = done.stdout.splitlines()
        assert len(lines) == len(values), f"AvroDecode answered {len(lines)} of {len(values)}:\n{done.stderr}"
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="session")
def avro_java() -> AvroJava:
    java, classpath = build_java_tool("avro-decode")
    return AvroJava(java, classpath)
