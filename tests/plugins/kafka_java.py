"""Apache Kafka's own Java producer, as the reference of where a key lands: the `java_producer` fixture.

It builds tests/java/key-partitions (Maven, kafka-clients at the broker's version, Java 17) once, as
tests/plugins/avro_java.py builds its tool. `java_producer.partitions(bootstrap, topic, keys)` sends each key
(as StringSerializer writes it) with the Java producer's default partitioner and returns the partition each
was acknowledged on. Without Java 17 or Maven a developer's run skips with the reason; under CI=true that is a
failure.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from tests.plugins.avro_java import build_java_tool

MAIN_CLASS = "outbox.cdc.interop.KeyPartitions"


class JavaProducer:
    def __init__(self, java: str, classpath: list[str]) -> None:
        self.java, self.classpath = java, classpath

    def partitions(self, bootstrap: str, topic: str, keys: Sequence[str]) -> list[int]:
        argv = [self.java, "-cp", ":".join(self.classpath), MAIN_CLASS, bootstrap, topic]
        stdin = "".join(f"{key.encode().hex()}\n" for key in keys)
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"KeyPartitions exited {done.returncode}:\n{done.stderr[-3000:]}"
        lines = done.stdout.split()
        assert len(lines) == len(keys), f"KeyPartitions answered {len(lines)} of {len(keys)}:\n{done.stderr}"
        return [int(line) for line in lines]


@pytest.fixture(scope="session")
def java_producer() -> JavaProducer:
    return JavaProducer(*build_java_tool("key-partitions"))
