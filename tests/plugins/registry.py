"""Schema Registry fixture: the URL of a Confluent-compatible registry (the stack's Apicurio Registry, whose
Confluent API is under /apis/ccompat/v7), checked to answer."""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from typing import Any

import pytest

from tests.plugins.services import service_missing


def registry_ca(url: str) -> str | None:
    """The CA that signed the certificate of `url`'s server: the secure stack's for its registry (HTTPS),
    else none."""
    # Every HTTPS registry of the tests is the stack's, directly or through a test's proxy.
    if urllib.parse.urlsplit(url).scheme == "https":
        return os.environ.get("CDC_SCHEMA_REGISTRY_CA_FILE") or None
    return None


def registry_get(url: str, timeout: float = 10) -> Any:
    """GET `url` from the stack's registry, trusting its CA, and the answer's JSON."""
    ca = registry_ca(url)
    context = ssl.create_default_context(cafile=ca) if ca else None
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
        return json.load(response)


def registry_client_config(url: str) -> dict[str, str]:
    """A SchemaRegistryClient's configuration for `url`: the stack's CA on the secure stack."""
    ca = registry_ca(url)
    return {"url": url, **({"ssl.ca.location": ca} if ca else {})}


@pytest.fixture(scope="session")
def schema_registry_url() -> str:
    url = os.environ.get("CDC_SCHEMA_REGISTRY_URL", "").rstrip("/")
    if not url:
        service_missing("the Schema Registry is not configured: CDC_SCHEMA_REGISTRY_URL is not set")
        raise AssertionError("unreachable")
    try:
        subjects = registry_get(f"{url}/subjects")
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; a non-JSON answer a ValueError
        service_missing(f"the Schema Registry does not answer at {url}: {exc}")
        raise AssertionError("unreachable") from exc
    if not isinstance(subjects, list):
        service_missing(f"{url}/subjects is not a Confluent-compatible Schema Registry API (not a JSON list)")
    return url
