"""cdc.fastpath: the setting fast_path, with and without the compiled extension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc import fastpath
from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import SchemaStore
from cdc.errors import ConfigError
from cdc.stream.route import EventRouter
from tests.unit.stream.test_route import DEFAULT_COLUMNS, relation, router

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _router(compiled: bool) -> EventRouter:
    routed = router(compiled=compiled)
    routed.relation(relation(DEFAULT_COLUMNS))
    return routed


def test_without_the_extension_auto_falls_back_and_required_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level("INFO", logger="cdc.pipeline")
    monkeypatch.setattr(fastpath, "extension", None)
    assert not fastpath.enabled("auto")
    assert "hot path: Python, slower: the compiled extension cdc._fastpath is not installed" in caplog.text
    with pytest.raises(ConfigError, match="setting 'fast_path' is 'required' but") as refused:
        fastpath.enabled("required")
    assert refused.value.key == "fast_path"
    encoder = AvroEncoder(SchemaStore(SCHEMAS)).encoder_for("OrderPlaced", 1)
    assert type(encoder).__name__ == "function", "the Python encoder"
    assert _router(compiled=True).row_reader is None


def test_off_is_python_everywhere(caplog: Any) -> None:
    caplog.set_level("INFO", logger="cdc.pipeline")
    assert not fastpath.enabled("off")
    assert "hot path: Python (fast_path = off)" in caplog.text
    assert _router(compiled=False).row_reader is None
    encoder = AvroEncoder(SchemaStore(SCHEMAS), compiled=False).encoder_for("OrderPlaced", 1)
    assert type(encoder).__name__ == "function"


@pytest.mark.usefixtures("compiled_extension")
def test_with_the_extension_auto_and_required_use_it(caplog: Any) -> None:
    caplog.set_level("INFO", logger="cdc.pipeline")
    assert fastpath.enabled("auto") and fastpath.enabled("required")
    assert "hot path: compiled" in caplog.text
    assert _router(compiled=True).row_reader is not None
    encoder = AvroEncoder(SchemaStore(SCHEMAS)).encoder_for("OrderPlaced", 1)
    assert type(encoder).__name__ == "Encoder"
