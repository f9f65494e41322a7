"""Kafka Connect, Debezium and Apicurio's converter from Maven Central: ``pom.xml`` beside this module,
resolved once into ``.stack/debezium/libs`` (again when the pom changes, as stack/stack.sh does for the
broker's jars)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from tests.children import dying_with_parent

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
MIN_JAVA = 17


class JarsError(Exception):
    pass


def pom_key(pom: Path = POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def java_major(java: str = "java") -> int:
    """The major version of ``java`` (0 when it is missing or says nothing readable)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return parse_java_major(out.stderr + out.stdout)


def parse_java_major(text: str) -> int:
    """``openjdk version "17.0.15"`` -> 17; ``java version "1.8.0_392"`` -> 8."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not found:
        return 0
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def ensure_jars(stack_dir: Path, log: Path, progress=None) -> Path:
    """The directory of the worker's class path, resolved by Maven when missing or stale."""
    if java_major() < MIN_JAVA:
        raise JarsError(
            f"Kafka Connect needs Java {MIN_JAVA}+ on PATH (`make stack-up` installs openjdk-17-jre-headless)"
        )
    libs = (stack_dir / "debezium" / "libs").resolve()
    stamp = libs / ".resolved"
    want = pom_key()
    if stamp.exists() and stamp.read_text().strip() == want:
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("mvn is not on PATH (`make stack-up` installs Debian's maven package)")
    if progress is not None:
        progress("jars", f"resolving {POM.relative_to(HERE.parents[2])} from Maven Central into {libs}")
    shutil.rmtree(libs, ignore_errors=True)
    libs.mkdir(parents=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        done = subprocess.run(
            dying_with_parent(
                [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies"]
                + [f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
    if done.returncode != 0:
        raise JarsError(f"mvn could not resolve {POM.name}'s dependencies; see {log}")
    stamp.write_text(want + "\n")
    return libs
