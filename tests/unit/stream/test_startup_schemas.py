"""`cdc run` does not start with a schema file that Avro cannot parse (the check of `cdc schemas check`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cdc.config_loader import load_settings
from cdc.errors import ConfigError
from cdc.stream.pipeline import Pipeline

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


class _Sink:
    def check_broker(self, timeout: float) -> None:
        raise AssertionError("the pipeline went on to Kafka with a broken schema")


# The pipeline loads schemas_dir as `cdc schemas check` checks it (cdc.avro.reload.SchemaSet), before Kafka.
def test_a_schema_avro_cannot_parse_stops_the_start(tmp_path: Path) -> None:
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, schemas)
    v2 = json.loads((schemas / "OrderPlaced" / "v2.avsc").read_text())
    v2["fields"].append({"name": "a-b", "type": "int", "default": 0})
    (schemas / "OrderPlaced" / "v3.avsc").write_text(json.dumps(v2))
    settings = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"schemas_dir": str(schemas)},
    )
    with pytest.raises(ConfigError) as info:
        Pipeline(settings, sink=_Sink()).run()  # type: ignore[arg-type]
    message = str(info.value)
    assert info.value.key == "schemas_dir" and info.value.exit_code == 2
    assert "1 problem(s)" in message and str(schemas / "OrderPlaced" / "v3.avsc") in message
    assert f"at fields[{len(v2['fields']) - 1}].name" in message and "(rule: name)" in message
    assert "\n" not in message
