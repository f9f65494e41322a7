"""``cdc schemas check --registry``: the local versions against what the schema registry already holds.

The versions in the registry are the ones consumers have. Before ``cdc schemas register`` (in a deploy
pipeline), each local version that the registry does not hold yet under its subject is checked against the
subject's deployed versions twice: by our checker (:func:`cdc.avro.compat.check_pair`) and by the registry's
own compatibility endpoint (``POST /compatibility/subjects/{subject}/versions/latest``). Both use the
subject's compatibility level in the registry (its own, else the global one), against the latest deployed
version or, in a transitive mode, against every one. A version either side refuses is a problem, and so is a
version on which the two disagree (then one of the checkers is wrong about Avro: docs/schema-checks.md says
where ours departs from Java on purpose), and a level in the registry other than ``schema_compatibility``.

Subjects are named as ``cdc schemas register`` names them (:func:`cdc.avro.catalog.target_topics` and the
``subject_name_strategy``). A local file is deployed when the registry's lookup finds it under the subject
(the registry's own notion of the same schema: a decimal with a new scale is a new version, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc.avro.catalog import target_topics
from cdc.avro.compat import check_pair
from cdc.avro.registry import SchemaRegistry
from cdc.avro.store import StoredSchema
from cdc.avro.validate import InvalidSchemaError, validate_schema
from cdc.config import Settings
from cdc.errors import ConfigError, SchemaNotFoundError

__all__ = ["DeployedCheck", "DeployedReport", "check_deployed"]

_MISSING = 404


@dataclass(frozen=True)
class DeployedCheck:
    """One local version not yet in the registry, checked against the subject's deployed versions."""

    event_type: str
    version: int
    subject: str
    level: str
    against: tuple[int, ...]  # the registry's version numbers it was checked against
    ours: str  # "compatible" or "incompatible"
    registry: str  # "compatible", "incompatible" or "invalid" (the registry refused to parse it)
    reasons: tuple[str, ...] = ()  # ours, when incompatible

    @property
    def agree(self) -> bool:
        return self.ours == self.registry

    def __str__(self) -> str:
        what = f"{self.event_type} v{self.version} under subject {self.subject!r}"
        against = ", ".join(map(str, self.against))
        why = f": {'; '.join(self.reasons)}" if self.reasons else ""
        if not self.agree:
            return (
                f"DISAGREE: {what} ({self.level}, against deployed version(s) {against}): we find it "
                f"{self.ours}, the registry finds it {self.registry}{why}"
            )
        if self.ours == "compatible":
            return f"ok: {what} is {self.level} compatible with deployed version(s) {against}, for both"
        return (
            f"FAIL: {what} is not {self.level} compatible with deployed version(s) {against}, for both{why}"
        )


@dataclass
class DeployedReport:
    url: str
    lines: list[str] = field(default_factory=list)  # what was found, the checks included, for the reader
    checks: list[DeployedCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what is wrong besides the checks

    @property
    def failing(self) -> list[DeployedCheck]:
        """The checks either side refused, and those on which the two disagree."""
        return [c for c in self.checks if c.ours != "compatible" or not c.agree]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.failing


def check_deployed(
    settings: Settings,
    *,
    aggregate_types: list[str],
    topics: list[str],
    registry: SchemaRegistry,
) -> DeployedReport:
    """Check every event type's local versions against the subjects of the given topics (as ``register``)."""
    store = registry.store
    report = DeployedReport(registry.shown_url)
    by_type: dict[str, list[int]] = {}
    for event_type, version in store.available():
        by_type.setdefault(event_type, []).append(version)
    for event_type, versions in sorted(by_type.items()):
        try:
            stored = [store.get(event_type, v) for v in versions]
        except SchemaNotFoundError:
            continue  # the local check reports it; nothing to compare
        for topic in target_topics(settings, registry.strategy, event_type, aggregate_types, topics):
            by_subject: dict[str, list[StoredSchema]] = {}
            for s in stored:
                by_subject.setdefault(registry.subject(topic, s), []).append(s)
            for subject, local in by_subject.items():
                _check_subject(settings, registry, report, subject, local)
    return report


def _check_subject(
    settings: Settings,
    registry: SchemaRegistry,
    report: DeployedReport,
    subject: str,
    local: list[StoredSchema],
) -> None:
    client = registry.client
    what = f"subject {subject!r}"
    try:
        numbers = client.get_versions(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code != _MISSING:
            raise registry.unavailable(f"listing the versions of {what}", exc) from exc
        numbers = []
    except Exception as exc:
        raise registry.unavailable(f"listing the versions of {what}", exc) from exc
    deployed: list[tuple[int, Any]] = []  # (the registry's version, its schema)
    for number in sorted(numbers):
        try:
            text = client.get_version(subject, number).schema.schema_str or ""
        except Exception as exc:
            raise registry.unavailable(f"fetching version {number} of {what}", exc) from exc
        schema = orjson.loads(text)
        try:
            validate_schema(schema)
        except InvalidSchemaError as exc:
            report.problems.append(f"version {number} of {what} in the registry is not valid Avro {exc}")
        deployed.append((number, schema))
    event_type = local[0].event_type
    if not deployed:
        span = f"v{local[0].version}..v{local[-1].version}"
        report.lines.append(f"{what}: nothing deployed yet; {event_type} {span} would be its first versions")
        return
    level = _level(registry, subject)
    if level != settings.schema_compatibility:
        report.problems.append(
            f"{what} has compatibility {level} in the registry, but schema_compatibility is "
            f"{settings.schema_compatibility} (`cdc schemas register` sets it)"
        )
    held: dict[int, int] = {}  # local version -> the registry's version of the same schema
    for st in local:
        if (found := _lookup(registry, subject, st)) is not None:
            held[st.version] = found
    known = [f"{event_type} v{v} = version {n}" for v, n in held.items()]
    report.lines.append(
        f"{what}: {len(deployed)} deployed version(s), {level}" + (f"; {', '.join(known)}" if known else "")
    )
    for number, _ in deployed:
        if number not in held.values():
            report.lines.append(
                f"{what}: deployed version {number} matches none of the local {event_type} files"
            )
    against = deployed if level.endswith("_TRANSITIVE") else deployed[-1:]
    for s in local:
        if s.version in held:
            continue
        check = _check_version(registry, subject, level, s, against)
        report.checks.append(check)
        report.lines.append(str(check))


def _lookup(registry: SchemaRegistry, subject: str, s: StoredSchema) -> int | None:
    """The registry's version of ``s`` under ``subject``, if it holds it (its own notion of "the same")."""
    try:
        found = registry.client.lookup_schema(subject, Schema(s.text, "AVRO"))
    except SchemaRegistryError as exc:
        if exc.http_status_code == _MISSING:
            return None
        raise registry.unavailable(f"looking up {s.event_type} v{s.version} under {subject!r}", exc) from exc
    except Exception as exc:
        raise registry.unavailable(f"looking up {s.event_type} v{s.version} under {subject!r}", exc) from exc
    return None if found.version is None else int(found.version)


def _level(registry: SchemaRegistry, subject: str) -> str:
    for name in (subject, None):
        try:
            return str(registry.client.get_compatibility(name)).upper()
        except SchemaRegistryError as exc:
            if exc.http_status_code != _MISSING or name is None:
                raise registry.unavailable("reading the compatibility level", exc) from exc
        except Exception as exc:
            raise registry.unavailable("reading the compatibility level", exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _check_version(
    registry: SchemaRegistry, subject: str, level: str, s: StoredSchema, against: list[tuple[int, Any]]
) -> DeployedCheck:
    mode = level if level in ("NONE", "BACKWARD", "FORWARD", "FULL") else level.removesuffix("_TRANSITIVE")
    if mode not in ("NONE", "BACKWARD", "FORWARD", "FULL"):
        raise ConfigError(f"subject {subject!r} has compatibility {level!r} in the registry, unknown to cdc")
    new = orjson.loads(s.text)
    reasons: list[str] = []
    for number, schema in against:
        try:
            problems = check_pair(new, schema, mode)
        except InvalidSchemaError:
            continue  # reported with the deployed version
        reasons += [
            f"against version {number}, {p.rule} at {p.path or 'the top level'}: {p.message}"
            for p in problems
        ]
    try:
        compatible = registry.client.test_compatibility(subject, Schema(s.text, "AVRO"))
        theirs = "compatible" if compatible else "incompatible"
    except SchemaRegistryError as exc:
        if exc.http_status_code != 422:
            raise registry.unavailable(
                f"testing {s.event_type} v{s.version} against {subject!r}", exc
            ) from exc
        theirs = "invalid"
    except Exception as exc:
        raise registry.unavailable(f"testing {s.event_type} v{s.version} against {subject!r}", exc) from exc
    return DeployedCheck(
        s.event_type,
        s.version,
        subject,
        level,
        tuple(number for number, _ in against),
        "incompatible" if reasons else "compatible",
        theirs,
        tuple(reasons),
    )
