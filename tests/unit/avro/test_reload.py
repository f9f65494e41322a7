"""The schemas `cdc run` encodes with: checked at start, re-read on a miss (throttled) or on demand, and a
re-read that `cdc schemas check` refuses, or that changes a loaded version, leaves the loaded set in use."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from cdc.avro.reload import SchemaSet
from cdc.errors import ConfigError, SchemaNotFoundError

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def order_placed(version: int, extra: list[dict[str, object]]) -> str:
    v2 = json.loads((SCHEMAS / "OrderPlaced" / "v2.avsc").read_text())
    v2["fields"] += extra
    return json.dumps(v2)


COMPATIBLE_V3 = order_placed(3, [{"name": "channel", "type": ["null", "string"], "default": None}])
BREAKING_V3 = order_placed(3, [{"name": "channel", "type": "string"}])  # no default: v3 cannot read v2


@pytest.fixture
def schemas(tmp_path: Path) -> Path:
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    return tmp_path / "schemas"


def v3(schemas: Path, text: str) -> None:
    (schemas / "OrderPlaced" / "v3.avsc").write_text(text)


def test_a_miss_rereads_the_directory_throttled_per_version_and_in_all(schemas: Path, caplog):
    caplog.set_level(logging.INFO, "cdc.schemas")
    clock = Clock()
    loaded = SchemaSet(schemas, "BACKWARD", interval=10, gap=1, clock=clock)
    with pytest.raises(SchemaNotFoundError, match=r"no schema for OrderPlaced v3 among the 4 loaded from"):
        loaded.encoder.encoder_for("OrderPlaced", 3)
    v3(schemas, COMPATIBLE_V3)
    with pytest.raises(SchemaNotFoundError):
        loaded.encoder.encoder_for("OrderPlaced", 3)  # sealed: a file that appears is not read by itself
    assert loaded.reload_on_miss("OrderPlaced", 3) is True
    assert len(loaded) == 5
    assert loaded.encoder.encoder_for("OrderPlaced", 3)(json.dumps(payload(channel="web")))
    assert "(no schema loaded for 'OrderPlaced' v3): 5 schemas, new: OrderPlaced v3" in caplog.text

    shipped_v2 = schemas / "OrderShipped" / "v2.avsc"
    clock.now += 0.5
    assert loaded.reload_on_miss("Unknown", 1) is False, "within the gap of any re-read"
    clock.now += 0.5
    assert loaded.reload_on_miss("Unknown", 1) is False, "nothing new"
    shipped_v2.write_text((schemas / "OrderShipped" / "v1.avsc").read_text())
    clock.now += 9.9
    assert loaded.reload_on_miss("Unknown", 1) is False, "throttled: the same pair within its interval"
    with pytest.raises(SchemaNotFoundError, match=r"re-read 10 s ago; a missing version re-reads it at most"):
        loaded.encoder.encoder_for("OrderShipped", 2)
    assert loaded.reload_on_miss("OrderShipped", 2) is True, "another pair, past the gap"
    assert loaded.reloads == {"used": 2, "unchanged": 1, "refused": 0}


def test_a_reread_that_fails_the_check_is_logged_and_the_loaded_set_stays(schemas: Path, caplog):
    clock = Clock()
    loaded = SchemaSet(schemas, "BACKWARD", clock=clock)
    before = loaded.encoder
    v3(schemas, BREAKING_V3)
    assert loaded.reload_on_miss("OrderPlaced", 3) is False
    assert loaded.encoder is before and len(loaded) == 4
    assert "kept the 4 schemas loaded before: it fails `cdc schemas check` (BACKWARD)" in caplog.text
    assert "channel" in caplog.text
    with pytest.raises(SchemaNotFoundError, match=r"that re-read was not used: .*channel"):
        loaded.encoder.encoder_for("OrderPlaced", 3)

    v3(schemas, "{not json")
    assert loaded.reload("SIGHUP") is False, "a half-written file: the next re-read tries again"
    v3(schemas, COMPATIBLE_V3)
    assert loaded.reload("SIGHUP") is True, "on demand: not throttled"
    assert loaded.reloads == {"used": 1, "unchanged": 0, "refused": 2}
    assert loaded.reload("SIGHUP") is False
    assert loaded.reloads["unchanged"] == 1


def test_a_loaded_version_that_changed_or_vanished_is_refused(schemas: Path, caplog):
    loaded = SchemaSet(schemas, "BACKWARD")
    shipped = schemas / "OrderShipped" / "v1.avsc"
    original = shipped.read_text()
    changed = json.loads(original)
    changed["doc"] = "edited"
    changed["fields"].append({"name": "handed_over_note", "type": ["null", "string"], "default": None})
    shipped.write_text(json.dumps(changed))
    v3(schemas, COMPATIBLE_V3)
    assert loaded.reload("SIGHUP") is False
    assert "OrderShipped v1 changed since it was loaded" in caplog.text
    shutil.rmtree(schemas / "OrderShipped")
    assert loaded.reload("SIGHUP") is False
    assert "OrderShipped v1 is in use and its file is gone" in caplog.text
    with pytest.raises(SchemaNotFoundError):
        loaded.encoder.encoder_for("OrderPlaced", 3)
    assert loaded.encoder.encoder_for("OrderShipped", 1), "still served as loaded"


def test_a_directory_that_fails_the_check_is_refused_at_start(schemas: Path):
    v3(schemas, BREAKING_V3)
    (schemas / "OrderPlaced" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        SchemaSet(schemas, "BACKWARD")
    assert info.value.key == "schemas_dir"
    assert info.value.exit_code == 2
    message = str(info.value)
    assert message.startswith(f"setting 'schemas_dir': {schemas} fails `cdc schemas check` (BACKWARD) with 2")
    assert "notes.txt" in message and message.endswith("fix the files before `cdc run`")
    with pytest.raises(ConfigError, match="is not a directory"):
        SchemaSet(schemas / "missing", "BACKWARD")


def test_an_invalid_name_keeps_its_own_message(schemas: Path):
    loaded = SchemaSet(schemas, "BACKWARD")
    with pytest.raises(SchemaNotFoundError, match="is not a valid schema name"):
        loaded.store.get("no-such type", 1)


def payload(**extra: object) -> dict[str, object]:
    return {
        "order_id": "o-1",
        "customer_id": "c-1",
        "amount_cents": 1,
        "currency": "EUR",
        "items": [],
        **extra,
    }


DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}


@pytest.mark.parametrize(
    ("field", "change"),
    [
        pytest.param("amount_cents", {"default": 0}, id="a default"),
        pytest.param(
            "amount_cents", {"type": {"type": "long", "logicalType": "timestamp-millis"}}, id="logical"
        ),
        pytest.param("discount", {"type": {**DECIMAL, "scale": 3}}, id="decimal scale"),
    ],
)
def test_an_edit_the_fingerprint_does_not_see_is_refused_too(schemas: Path, caplog, field, change):
    """A default, a logical type, a decimal's scale: not in the Parsing Canonical Form, so not in the
    fingerprint, yet what the bytes mean (12.34 read back as 1.234). Each is a change to a published
    version, refused like any other."""
    path = schemas / "OrderPlaced" / "v2.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append({"name": "discount", "type": DECIMAL})
    path.write_text(json.dumps(schema))
    loaded = SchemaSet(schemas, "NONE")
    next(f for f in schema["fields"] if f["name"] == field).update(change)
    path.write_text(json.dumps(schema))
    v3(schemas, COMPATIBLE_V3)
    assert loaded.reload("SIGHUP") is False
    assert "OrderPlaced v2 changed since it was loaded" in caplog.text


def test_white_space_and_key_order_are_no_change(schemas: Path, caplog):
    loaded = SchemaSet(schemas, "BACKWARD")
    path = schemas / "OrderPlaced" / "v2.avsc"
    schema = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(list(schema.items()))), indent=7))
    v3(schemas, COMPATIBLE_V3)
    assert loaded.reload("SIGHUP") is True
    assert "changed since it was loaded" not in caplog.text
