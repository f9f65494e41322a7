"""Service fixtures live in plugin modules; this file only registers them, and makes a native crash of any
Python process the tests start leave its Python stack (pytest's own faulthandler covers this process)."""

import os

os.environ.setdefault("PYTHONFAULTHANDLER", "1")

pytest_plugins = [
    "tests.plugins.services",
    "tests.plugins.postgres",
    "tests.plugins.kafka",
    "tests.plugins.kafka_acl",
    "tests.plugins.registry",
    "tests.plugins.proxy",
    "tests.plugins.pipeline",
    "tests.plugins.pgcluster",
    "tests.plugins.avro_reference",
    "tests.plugins.avro_java",
    "tests.plugins.kafka_java",
    "tests.plugins.fastpath",
    "tests.plugins.podman",
    "tests.plugins.helm",
    "tests.plugins.pods",
    "tests.plugins.jaeger",
]
