"""Pure parts of the Confluent framing: subject names, the wire header, credentials kept out of the URL
(registration against a real registry is in tests/integration/test_framing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.encode import SchemaStore, confluent_header
from cdc.errors import RegistryUnavailableError
from cdc.registry import SchemaRegistry

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [
        ("topic_record", "outbox.event.order-outbox.events.OrderPlaced"),
        ("topic", "outbox.event.order-value"),
        ("record", "outbox.events.OrderPlaced"),
    ],
)
def test_subject_name_strategies(strategy: str, subject: str) -> None:
    store = SchemaStore(SCHEMAS)
    registry = SchemaRegistry("http://127.0.0.1:1", store, strategy=strategy)
    assert registry.subject("outbox.event.order", store.get("OrderPlaced", 2)) == subject


def test_confluent_header_is_magic_zero_and_big_endian_id() -> None:
    assert confluent_header(1) == b"\x00\x00\x00\x00\x01"
    assert confluent_header(0x01020304) == b"\x00\x01\x02\x03\x04"


def test_credentials_never_reach_an_error_message() -> None:
    registry = SchemaRegistry("http://reg-user:s3cr3t@127.0.0.1:1/apis/ccompat/v7", SchemaStore(SCHEMAS))
    assert registry.shown_url == "http://reg-user:***@127.0.0.1:1/apis/ccompat/v7"
    with pytest.raises(RegistryUnavailableError) as caught:
        registry.schema_id("t", "OrderPlaced", 1)  # nothing listens on port 1: connection refused
    assert "s3cr3t" not in str(caught.value)
    assert "reg-user:***@127.0.0.1:1" in str(caught.value)
    assert "failed registering OrderPlaced v1 under subject 't-outbox.events.OrderPlaced'" in str(
        caught.value
    )
