"""Schema Registry fixture: the URL of a Confluent-compatible registry (the stack's Apicurio Registry, whose
Confluent API is under /apis/ccompat/v7), checked to answer."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.plugins.services import service_missing


@pytest.fixture(scope="session")
def schema_registry_url() -> str:
    url = os.environ.get("CDC_SCHEMA_REGISTRY_URL", "").rstrip("/")
    if not url:
        service_missing("the Schema Registry is not configured: CDC_SCHEMA_REGISTRY_URL is not set")
        raise AssertionError("unreachable")
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=10) as response:
            subjects = json.load(response)
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; a non-JSON answer a ValueError
        service_missing(f"the Schema Registry does not answer at {url}: {exc}")
        raise AssertionError("unreachable") from exc
    if not isinstance(subjects, list):
        service_missing(f"{url}/subjects is not a Confluent-compatible Schema Registry API (not a JSON list)")
    return url
