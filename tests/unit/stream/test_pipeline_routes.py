"""What the pipeline keeps per free-text value of a row (aggregate types, event types): bounded, and never a
failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.config import load_settings
from cdc.errors import AggregateTypeNotAllowedError, InvalidTopicError
from cdc.stream import pipeline as pipeline_module
from cdc.stream import route as route_module
from cdc.stream.pipeline import Pipeline

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


class _Sink:
    """Enough of KafkaSink for routing: every topic exists."""

    def ensure_topic(self, topic: str) -> None:
        pass

    def record_limit(self, topic: str) -> None:
        return None


def pipeline(**overrides) -> Pipeline:
    settings = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"schemas_dir": str(SCHEMAS), **overrides},
    )
    return Pipeline(settings, sink=_Sink())  # type: ignore[arg-type]


def test_the_route_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(pipeline_module, "MAX_ROUTES", 50)
    monkeypatch.setattr(route_module, "MAX_TOPICS", 50)
    p = pipeline()
    for i in range(200):
        p._route_for(f"type{i}".encode(), b"OrderPlaced", b"1")
    assert len(p._routes) <= 50
    assert len(p.router._topics) <= 50


def test_a_route_that_fails_is_not_kept():
    p = pipeline()
    for _ in range(3):
        with pytest.raises(InvalidTopicError):
            p._route_for(b"no such topic", b"OrderPlaced", b"1")
    assert p._routes == {}


def test_an_aggregate_type_outside_the_allow_list_is_the_events_fault():
    p = pipeline(aggregate_types=["order"])
    p._route_for(b"order", b"OrderPlaced", b"1")
    with pytest.raises(AggregateTypeNotAllowedError) as info:
        p._route_for(b"orderz", b"OrderPlaced", b"1")
    assert info.value.reason == "aggregate_type_not_allowed"
    assert list(p._routes) == [(b"order", b"OrderPlaced", b"1")]


def test_metric_series_per_topic_are_bounded(monkeypatch):
    monkeypatch.setattr(pipeline_module, "MAX_TOPIC_SERIES", 3)
    p = pipeline()
    series = {p._route_for(f"t{i}".encode(), b"OrderPlaced", b"1")[2] for i in range(10)}
    assert len(series) == 4 and pipeline_module.OTHER_TOPICS in series
