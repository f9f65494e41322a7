"""The tracing backend of the stack: Jaeger (`CDC_STACK_TRACING=1 make stack-up`), and reading traces back
from its query API. Under CI=true a Jaeger that is not there fails the test (tests/plugins/services.py)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.plugins.services import service_missing


def query(url: str, path: str, **params: Any) -> Any:
    """GET ``path`` of Jaeger's query API (HTTP JSON, ``/api/...``) with ``params``; the parsed body."""
    full = f"{url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(full, timeout=10) as answer:
        return json.load(answer)


@pytest.fixture(scope="session")
def jaeger_url() -> str:
    """The query API of the stack's Jaeger, once it answers."""
    url = os.environ.get("CDC_STACK_JAEGER_URL")
    if not url:
        service_missing(
            "Jaeger is not running: CDC_STACK_JAEGER_URL is not set (CDC_STACK_TRACING=1 make stack-up)"
        )
    try:
        query(url, "/api/services")
    except (OSError, urllib.error.URLError) as exc:
        service_missing(f"Jaeger does not answer at {url}: {exc}")
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        service_missing("OTEL_EXPORTER_OTLP_ENDPOINT is not set: source .stack/env")
    return url


def traces_of(url: str, service: str, *, timeout: float = 30.0, least: int = 1) -> list[dict[str, Any]]:
    """The traces Jaeger holds of ``service``, once there are at least ``least`` (it stores what it received
    after a batching delay); fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = query(url, "/api/traces", service=service, limit=100, lookback="1h")["data"] or []
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # 404: no such service yet
                raise
            data = []
        if len(data) >= least or time.monotonic() >= deadline:
            assert len(data) >= least, f"Jaeger has {len(data)} traces of {service!r} after {timeout:g} s"
            return data
        time.sleep(0.5)


def spans(trace: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each span of a Jaeger trace with its tags as a dict."""
    for span in trace["spans"]:
        yield span, {tag["key"]: tag["value"] for tag in span.get("tags", [])}
