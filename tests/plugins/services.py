"""How a test finds the real services, and what happens when one is missing.

`make test` sources `.stack/env` (written by `make stack-up`) before pytest, so the services are named by
CDC_DATABASE_URL and CDC_KAFKA_BOOTSTRAP_SERVERS. When they are missing or do not answer, a developer's run
skips the integration tests with the reason; under CI=true the same situation is a test failure, because a
skipped integration suite would be a green CI that proves nothing.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def service_missing(message: str) -> None:
    """Fail under CI, skip on a developer's machine. Never returns."""
    if in_ci():
        pytest.fail(
            f"{message} (CI=true: a missing service is a failure, run `make stack-up`)", pytrace=False
        )
    pytest.skip(f"{message}; run `make stack-up` and `. .stack/env` (would fail under CI)")


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())[:24]


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Names that no other test (or earlier run) uses: `<prefix>_<test>_<random>`, safe as SQL identifiers
    and Kafka topic names."""

    test = _clean(request.node.name)

    def make(prefix: str) -> str:
        return f"{prefix}_{test}_{uuid.uuid4().hex[:10]}"

    return make


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests under tests/integration use real services; mark them so `-m "not integration"` works.
    secure_stack = os.environ.get("CDC_STACK_SECURE") == "1"
    for item in items:
        if "integration" in item.nodeid.split("/"):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("secure") is not None and not secure_stack:
            # Like a test for another PostgreSQL version: it runs where its stack does (make test-secure).
            item.add_marker(
                pytest.mark.skip(reason="plain stack: this test is for the secure stack (make test-secure)")
            )
        plain = item.get_closest_marker("plain")
        if plain is not None and secure_stack:
            # Not a missing service: the test compares with a client that the stack's plain mode serves
            # (`make test` on it, as CI runs it, does).
            item.add_marker(
                pytest.mark.skip(reason=f"secure stack: {plain.args[0]} (runs on the plain stack)")
            )
