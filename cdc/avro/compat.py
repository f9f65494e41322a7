"""Avro schema evolution checks: may a new version of an event type replace the versions before it?

Pure rules, no I/O: ``cdc schemas check`` (:mod:`cdc.avro.catalog`) runs them over every version in
``schemas_dir`` before a deploy, with the mode of the ``schema_compatibility`` setting; a registry applies the
same mode on its side when ``cdc schemas register`` or the pipeline registers a version. Whether one schema
reads another's data is decided by the rules of the Avro specification (:mod:`cdc.avro.resolution`); a
:class:`Violation` says what a problem means for two versions.

Modes (as in Confluent's schema registry), for a new version and the versions before it:

- ``BACKWARD``: the new version reads data written with the previous one (consumers upgrade first).
- ``FORWARD``: the previous version reads data written with the new one (producers upgrade first).
- ``FULL``: both. ``NONE``: no check.
- ``*_TRANSITIVE``: the same, against every earlier version rather than only the previous one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc.avro.resolution import Incompatibility, InvalidSchemaError, Node, parse, resolve
from cdc.config import MODES  # the setting schema_compatibility takes these

__all__ = ["MODES", "VersionGapError", "Violation", "check_pair", "check_versions"]

_DIRECTIONS: dict[str, tuple[str, ...]] = {
    "BACKWARD": ("backward",),
    "BACKWARD_TRANSITIVE": ("backward",),
    "FORWARD": ("forward",),
    "FORWARD_TRANSITIVE": ("forward",),
    "FULL": ("backward", "forward"),
    "FULL_TRANSITIVE": ("backward", "forward"),
    "NONE": (),
}


class VersionGapError(ValueError):
    """The versions of an event type are not numbered 1, 2, ... without holes."""


@dataclass(frozen=True)
class Violation:
    """An incompatibility between two versions of one event type, in one direction."""

    event_type: str
    new_version: int
    old_version: int
    direction: str  # "backward": the new version reads old data; "forward": the old version reads new data
    problem: Incompatibility

    def __str__(self) -> str:
        p = self.problem
        new, old = f"v{self.new_version}", f"v{self.old_version}"
        backward = self.direction == "backward"
        reader_v, writer_v = (new, old) if backward else (old, new)
        # Each side of the problem belongs to whichever version played that role in this direction.
        was, now = (p.writer, p.reader) if backward else (p.reader, p.writer)
        what = f"field '{p.path}'" if p.path else "the top-level schema"
        cannot = f": {reader_v} readers cannot read {writer_v} data"
        match p.rule, backward:
            case "missing-default", True:
                text = f"adds {what} without a default{cannot}"
            case "missing-default", False:
                text = f"removes {what} that {old} readers need and gives no default"
            case "type-mismatch" | "decimal-mismatch", _:
                text = f"changes {what} from {was} to {now}{cannot}"
            case "ambiguous-alias", _:
                several = f"several {writer_v} fields ({p.writer})"
                text = f"gives {what} a name and aliases that match {several}{cannot}"
            case "enum-symbol", True:
                text = f"removes enum symbol '{p.writer}' from {what} and has no enum default{cannot}"
            case "enum-symbol", False:
                text = (
                    f"adds enum symbol '{p.writer}' to {what}; {old} readers lack it and have no enum default"
                )
            case "fixed-size", _:
                text = f"changes the size of fixed {what} from {was} to {now}{cannot}"
            case "name-mismatch", _:
                text = (
                    f"renames the type of {what} from '{was}' to '{now}' with no alias '{p.writer}'{cannot}"
                )
            case "union-branch", True:
                text = (
                    f"changes {what} to {p.reader}, which cannot hold the {p.writer} values of {old}{cannot}"
                )
            case "union-branch", False:
                text = f"lets {what} hold {p.writer} values that {old} readers ({p.reader}) cannot read"
            case _:
                text = f"is incompatible with {old} at {what} ({p.rule}): {p.message}"
        return f"{self.event_type} {new} {text}"


def _directions(mode: str) -> tuple[str, ...]:
    if mode not in _DIRECTIONS:
        raise ValueError(f"unknown compatibility mode {mode!r}; valid modes: {', '.join(MODES)}")
    return _DIRECTIONS[mode]


def check_pair(new: Any, old: Any, mode: str) -> list[Incompatibility]:
    """Problems between two versions in ``mode`` (transitive modes check just this pair, like the others)."""
    directions = _directions(mode)
    new_node, old_node = parse(new), parse(old)
    problems: list[Incompatibility] = []
    for direction in directions:
        if direction == "backward":
            problems += resolve(new_node, old_node)
        else:
            problems += resolve(old_node, new_node)
    return problems


def check_versions(event_type: str, schemas: dict[int, Any], mode: str) -> list[Violation]:
    """Check that the versions of ``event_type`` evolve as ``mode`` demands; versions must be 1..N.

    A version that is not valid Avro raises InvalidSchemaError naming the event type and the version."""
    directions = _directions(mode)
    gap = f"{event_type}: versions must be contiguous from v1"
    for version in schemas:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise VersionGapError(f"{gap}; {version!r} is not a version number")
    for expected in range(1, len(schemas) + 1):
        if expected not in schemas:
            raise VersionGapError(f"{gap}; v{expected} is missing")
    nodes: dict[int, Node] = {}
    for version, schema in schemas.items():
        try:
            nodes[version] = parse(schema)
        except InvalidSchemaError as exc:
            raise InvalidSchemaError(
                exc.path, exc.rule, exc.message, subject=f"{event_type} v{version}"
            ) from exc
    violations: list[Violation] = []
    for new in range(2, len(nodes) + 1):
        for old in range(1, new) if mode.endswith("_TRANSITIVE") else (new - 1,):
            for direction in directions:
                reader, writer = (new, old) if direction == "backward" else (old, new)
                problems = resolve(nodes[reader], nodes[writer])
                violations += [Violation(event_type, new, old, direction, p) for p in problems]
    return violations
