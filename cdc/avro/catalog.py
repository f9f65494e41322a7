"""The schemas directory as a whole: what ``cdc schemas list``, ``check`` and ``register`` do.

``check`` is meant to gate a deploy: it reports, in one run, every file the pipeline would ignore or fail on
(misnamed files, invalid Avro, a record not named after its directory, defaults that do not fit), every gap
in the versions, and every pair of versions that breaks the configured compatibility mode (rules in
:mod:`cdc.avro.compat`). Anything reported makes the command exit non-zero.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from cdc.avro.compat import VersionGapError, Violation, check_versions
from cdc.avro.encoder import AvroEncoder
from cdc.avro.resolution import InvalidSchemaError
from cdc.avro.store import SCHEMA_FILE, SchemaStore
from cdc.config import Settings
from cdc.errors import ConfigError, EventError

if TYPE_CHECKING:  # its HTTP stack only for `register`: `cdc run` checks schemas on every re-read
    from cdc.avro.registry import SchemaRegistry

__all__ = ["CheckReport", "Registered", "SchemaInfo", "check_schemas", "list_schemas", "register_schemas"]


@dataclass(frozen=True)
class SchemaInfo:
    event_type: str
    version: int
    path: Path
    name: str = ""  # the record's full name
    fingerprint: str = ""  # CRC-64-AVRO, hex, as in single-object encoding
    fields: int = 0
    error: str = ""


@dataclass(frozen=True)
class CheckReport:
    schemas_dir: Path
    mode: str
    versions: dict[str, list[int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # everything wrong, one line each
    violations: list[Violation] = field(default_factory=list)  # the compatibility problems among them

    @property
    def ok(self) -> bool:
        return not self.problems


def list_schemas(schemas_dir: str | os.PathLike[str]) -> list[SchemaInfo]:
    """Every schema file, loaded; one that does not load carries its ``error``."""
    store = SchemaStore(schemas_dir)
    encoder = AvroEncoder(store)
    out = []
    for event_type, version in store.available():
        path = store.schemas_dir / event_type / f"v{version}.avsc"
        try:
            stored = store.get(event_type, version)
            encoder.encoder_for(event_type, version)  # compiles: catches defaults that do not fit
        except EventError as exc:
            out.append(SchemaInfo(event_type, version, path, error=exc.message))
            continue
        parsed = stored.parsed
        out.append(
            SchemaInfo(
                event_type,
                version,
                path,
                name=str(parsed["name"]),
                fingerprint=stored.fingerprint.hex(),
                fields=len(parsed.get("fields", ())),
            )
        )
    return out


def check_schemas(schemas_dir: str | os.PathLike[str], mode: str) -> CheckReport:
    """Everything wrong with the directory under compatibility ``mode`` (empty problems: all fine)."""
    root = Path(schemas_dir)
    report = CheckReport(root, mode)
    if not root.is_dir():
        where = "" if root.is_absolute() else f", relative to the working directory {Path.cwd()}"
        report.problems.append(
            f"{root} is not a directory (setting schemas_dir: {root.absolute()}{where}; give an absolute "
            "path when the process starts elsewhere)"
        )
        return report
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            for path in sorted(entry.iterdir()):
                if not SCHEMA_FILE.match(path.name):
                    report.problems.append(
                        f"{entry.name}/{path.name} is not named v<N>.avsc (N from 1, no leading zeros): "
                        "the pipeline ignores it"
                    )
    by_type: dict[str, dict[int, Any]] = defaultdict(dict)
    broken: set[str] = set()
    for info in list_schemas(root):
        report.versions.setdefault(info.event_type, []).append(info.version)
        if info.error:
            report.problems.append(info.error)
            broken.add(info.event_type)
            continue
        by_type[info.event_type][info.version] = orjson.loads(info.path.read_bytes())
    for event_type, versions in sorted(report.versions.items()):
        missing = sorted(set(range(1, max(versions) + 1)) - set(versions))
        if missing:
            report.problems.append(
                f"{event_type}: versions must be contiguous from v1; "
                + ", ".join(f"v{v}" for v in missing)
                + (" is" if len(missing) == 1 else " are")
                + " missing"
            )
        elif event_type not in broken:
            try:
                violations = check_versions(event_type, by_type[event_type], mode)
            except (VersionGapError, InvalidSchemaError) as exc:
                report.problems.append(f"{exc} ({root / event_type})")
                continue
            report.violations.extend(violations)
            report.problems.extend(str(v) for v in violations)
    return report


def target_topics(
    settings: Settings, strategy: str, event_type: str, aggregate_types: list[str], topics: list[str]
) -> list[str]:
    """The topics whose subjects hold ``event_type``: ``topics``, and the template's topic of each aggregate
    type; with the record strategy one (any) topic, as the subject is the record's name."""
    targets = [*topics]
    targets += [
        settings.topic_template.format(aggregate_type=a, event_type=event_type) for a in aggregate_types
    ]
    if strategy == "record":
        return targets[:1] or [""]  # one subject per record, whatever the topic
    if not targets:
        raise ConfigError(
            f"subject_name_strategy {strategy!r} names subjects after topics: give --topic or "
            "--aggregate-type (or use subject_name_strategy = 'record')",
            key="subject_name_strategy",
        )
    return list(dict.fromkeys(targets))


@dataclass(frozen=True)
class Registered:
    event_type: str
    version: int
    subject: str
    schema_id: int


def register_schemas(
    settings: Settings,
    *,
    aggregate_types: list[str],
    topics: list[str],
    event_types: list[str] | None = None,
    registry: SchemaRegistry | None = None,
) -> list[Registered]:
    """Register every version of every event type (or of ``event_types``), in order, under the subjects of
    the given topics (``topics``, and the template's topics of ``aggregate_types``)."""
    from cdc.avro.registry import SchemaRegistry

    store = SchemaStore(settings.schemas_dir)
    if registry is None:
        with SchemaRegistry.from_settings(settings, store) as own:
            return register_schemas(
                settings,
                aggregate_types=aggregate_types,
                topics=topics,
                event_types=event_types,
                registry=own,
            )
    known = sorted({event_type for event_type, _ in store.available()})
    wanted = known if event_types is None else event_types
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ConfigError(f"no schemas in {store.schemas_dir} for event type(s) {', '.join(unknown)}")
    # Nothing reaches the registry unless every version to register is valid Avro.
    if failures := store.check_all(wanted):
        raise ConfigError(
            f"{len(failures)} schema file(s) in {store.schemas_dir} cannot be used, nothing was registered "
            f"(`cdc schemas check` lists every problem): {'; '.join(map(str, failures))}",
            key="schemas_dir",
        )
    out: list[Registered] = []
    for event_type in wanted:
        for topic in target_topics(settings, registry.strategy, event_type, aggregate_types, topics):
            for version, subject, schema_id in registry.register_all(topic, event_type):
                out.append(Registered(event_type, version, subject, schema_id))
    return out
