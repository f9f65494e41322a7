"""The schema store: the event schemas of ``<schemas_dir>/<event_type>/v<N>.avsc``, loaded and cached.

Everything Avro starts here. The encoder (:mod:`cdc.avro.encoder`) compiles each schema it is given, the
registry (:mod:`cdc.avro.registry`) registers its text, the deserializer (:mod:`cdc.avro.deserialize`) finds
a writer's schema by its fingerprint, and ``cdc schemas`` (:mod:`cdc.avro.catalog`) checks the directory as
a whole (the layout: ``schemas/README.md``).

Every file is checked by :func:`cdc.avro.validate.validate_schema` (valid Avro for the specification and for
Java) before fastavro parses what Avro makes of it. A schema file that is missing, unreadable, not valid Avro,
or not a record named after its event type is a SchemaNotFoundError naming the file, and for invalid Avro the
JSON path and the rule: ``cdc run`` refuses to start with one (:meth:`SchemaStore.check_all`); one that turns
bad later sends its events to the DLQ (``schema_not_found``) and the stream goes on. Failures are not cached,
so a fixed file is picked up.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from cdc.avro.validate import InvalidSchemaError, validate_schema
from cdc.errors import SchemaNotFoundError

__all__ = ["AVRO_NAME", "SCHEMA_FILE", "SchemaStore", "StoredSchema"]

AVRO_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # an Avro name; an event type is one too
SCHEMA_FILE: Final = re.compile(r"v[1-9][0-9]*\.avsc\Z")  # v<N>.avsc, N from 1, no leading zeros
_MAX_DEPTH: Final = 254  # the deepest JSON orjson.dumps writes


@dataclass(frozen=True)
class StoredSchema:
    """One loaded schema file. ``parsed`` is fastavro's parsed form (usable with its reader and writer)."""

    event_type: str
    version: int
    path: Path
    parsed: Any
    canonical: str  # Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO of ``canonical``: 8 bytes, little-endian, as in single-object encoding
    text: str = ""  # the file's JSON, compacted: what a registry gets (the canonical form drops defaults)


class SchemaStore:
    """Schemas from ``<schemas_dir>/<event_type>/v<N>.avsc``, loaded on first use and cached."""

    def __init__(self, schemas_dir: str | os.PathLike[str]) -> None:
        self.schemas_dir = Path(schemas_dir)
        self._cache: dict[tuple[str, int], StoredSchema] = {}
        self._by_fingerprint: dict[bytes, StoredSchema] = {}

    def get(self, event_type: str, version: int) -> StoredSchema:
        """The schema of ``event_type`` / ``version``; SchemaNotFoundError when it is missing or invalid."""
        if (hit := self._cache.get((event_type, version))) is not None:
            return hit
        if not isinstance(event_type, str) or not AVRO_NAME.match(event_type):
            raise SchemaNotFoundError(f"event type {str(event_type)[:64]!r} is not a valid schema name")
        if type(version) is not int or version < 1:
            raise SchemaNotFoundError(f"{event_type}: schema version must be an integer >= 1")
        what, path = f"{event_type} v{version}", self.schemas_dir / event_type / f"v{version}.avsc"
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise SchemaNotFoundError(f"no schema for {what}: {path} does not exist") from None
        except OSError as exc:
            raise SchemaNotFoundError(f"schema for {what}: cannot read {path}: {exc.strerror}") from exc
        try:
            source = orjson.loads(text)
        except orjson.JSONDecodeError as exc:  # also a file deeper than the 1024 levels orjson reads
            raise SchemaNotFoundError(f"schema for {what} in {path} is not valid Avro: {exc}") from exc
        try:
            # The text a registry gets. orjson writes at most 254 levels of arrays and objects (it reads
            # 1024), its only refusal of what orjson.loads made: a deeper file is refused here, before the
            # validator and fastavro recurse into it, as the SchemaNotFoundError callers handle (it was a
            # TypeError out of get(), past check_all and by_fingerprint).
            compact = orjson.dumps(source).decode()
        except orjson.JSONEncodeError:
            raise SchemaNotFoundError(
                f"schema for {what} in {path} is nested too deeply: more than {_MAX_DEPTH} levels of JSON "
                "arrays and objects"
            ) from None
        try:
            parsed = parse_schema(validate_schema(source))
            canonical = to_parsing_canonical_form(parsed)
        except InvalidSchemaError as exc:
            raise SchemaNotFoundError(f"schema for {what} in {path} is not valid Avro {exc}") from exc
        except Exception as exc:
            raise SchemaNotFoundError(f"schema for {what} in {path} is not valid Avro: {exc}") from exc
        if not (
            isinstance(parsed, dict)
            and parsed.get("type") == "record"
            and str(parsed.get("name")).rpartition(".")[2] == event_type
        ):
            raise SchemaNotFoundError(f"schema for {what} in {path} must be a record named {event_type!r}")
        fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
        stored = StoredSchema(event_type, version, path, parsed, canonical, fp, compact)
        self._cache[(event_type, version)] = stored
        known = self._by_fingerprint.get(fp)  # equal canonical forms: the lowest (event type, version) wins
        if known is None or (event_type, version) < (known.event_type, known.version):
            self._by_fingerprint[fp] = stored
        return stored

    def check_all(self, event_types: Collection[str] | None = None) -> list[SchemaNotFoundError]:
        """Load every schema file (of ``event_types``): the failures, each naming its file and reason."""
        failures = []
        for key in self.available():
            if event_types is not None and key[0] not in event_types:
                continue
            try:
                self.get(*key)
            except SchemaNotFoundError as exc:
                failures.append(exc)
        return failures

    def available(self) -> list[tuple[str, int]]:
        """Every ``(event_type, version)`` that has a file in the directory, sorted; files are not parsed."""
        return sorted(
            (f.parent.name, int(f.stem[1:]))
            for f in self.schemas_dir.glob("*/v*.avsc")
            if AVRO_NAME.match(f.parent.name) and SCHEMA_FILE.match(f.name) and f.is_file()
        )

    def by_fingerprint(self, fp: bytes) -> tuple[str, int]:
        """``(event_type, version)`` of the schema with this fingerprint (8 bytes, little-endian CRC-64-AVRO).

        A miss scans the directory: new files are found, files that fail to load are skipped and counted.
        """
        fp = bytes(fp)
        if (hit := self._by_fingerprint.get(fp)) is None:
            for key in self.available():
                with contextlib.suppress(SchemaNotFoundError):
                    self.get(*key)
            hit = self._by_fingerprint.get(fp)
        if hit is None:
            broken = sum(key not in self._cache for key in self.available())
            note = f" ({broken} schema files could not be loaded)" if broken else ""
            raise SchemaNotFoundError(f"no schema in {self.schemas_dir} has fingerprint {fp.hex()}{note}")
        return hit.event_type, hit.version
