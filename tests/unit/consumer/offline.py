"""An IdempotentConsumer for unit tests: nothing is connected, and its Kafka clients are fakes put in place by
the test."""

from __future__ import annotations

from typing import Any

from cdc.consumer import IdempotentConsumer


def offline_consumer(**overrides: Any) -> IdempotentConsumer:
    """The service ``inv`` on ``outbox.event.order`` with a handler that does nothing; ``overrides`` replace
    any argument."""
    arguments: dict[str, Any] = {
        "name": "inv",
        "topics": ["outbox.event.order"],
        "handler": lambda conn, event: None,
        "database_url": "postgresql://localhost/none",
        "bootstrap_servers": "localhost:1",
        **overrides,
    }
    return IdempotentConsumer(**arguments)
