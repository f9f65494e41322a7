"""The schemas `cdc run` encodes with: a checked snapshot of schemas_dir, re-read on a miss or on SIGHUP.

A worker lives for days and deploys add schema versions under it. The pipeline encodes with a *snapshot*:
every file of ``schemas_dir``, loaded and compiled at start once the checks of ``cdc schemas check`` passed
(a directory that fails them is refused at start, exit 2, as a deploy gate would). After that the pipeline
reads the directory only when it re-reads it as a whole:

- an event whose (event type, version) is not in the snapshot re-reads it before the event is
  dead-lettered, throttled: for one (event type, version) at most once every :data:`RELOAD_INTERVAL`
  seconds, and for all of them together at most once every :data:`RELOAD_GAP` seconds. A flood of events
  without a schema costs a re-read per interval and no disk access per event, while a version that a deploy
  adds is found by its first event (unless another miss re-read the directory less than a second before);
- SIGHUP re-reads it at once (``kill -HUP``, after a deploy that only added schemas).

A re-read is used only when the whole directory passes ``cdc schemas check`` (the same function, under
``schema_compatibility``) and still holds every loaded version unchanged, its whole JSON but for white space
and the order of keys (a default, a logical type or a decimal's scale are not in the fingerprint, yet change
what the bytes mean): a published version never changes (``schemas/README.md``), and the routes the
pipeline cached keep encoding with it. Otherwise the re-read is logged with its problems and the loaded
snapshot stays in use; a broken file never stops the stream.

Known schemas never see any of this: the pipeline's routes hold compiled encoders, and a miss is a lookup in
a frozen set.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from cdc.avro.catalog import check_schemas
from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import AVRO_NAME, SchemaStore, StoredSchema
from cdc.errors import ConfigError, EventError, SchemaNotFoundError
from cdc.logs import shown

__all__ = ["RELOAD_INTERVAL", "SchemaSet", "SealedStore"]

log = logging.getLogger("cdc.schemas")

RELOAD_INTERVAL: Final = 10.0  # seconds between two re-reads for misses of the same (event type, version)
RELOAD_GAP: Final = 1.0  # seconds between any two re-reads that misses start
MAX_MISSES: Final = 1000  # (event type, version) pairs remembered for the throttle: they come from rows
SHOWN_PROBLEMS: Final = 5  # problems named in one log line or error; `cdc schemas check` lists them all

Key = tuple[str, int]


class SealedStore(SchemaStore):
    """A :class:`SchemaStore` that serves the versions it was sealed with and reads nothing more from disk."""

    def __init__(self, schemas_dir: str | os.PathLike[str]) -> None:
        super().__init__(schemas_dir)
        self.sealed: frozenset[Key] | None = None  # None while loading
        self.note: Callable[[], str] = str  # appended to a miss's message: when the directory was re-read

    def get(self, event_type: str, version: int) -> StoredSchema:
        sealed = self.sealed
        if sealed is None or (event_type, version) in sealed:
            return super().get(event_type, version)
        if not isinstance(event_type, str) or not AVRO_NAME.match(event_type) or type(version) is not int:
            return super().get(event_type, version)  # its own message says what is wrong with the name
        raise SchemaNotFoundError(
            f"no schema for {event_type} v{version} among the {len(sealed)} loaded from "
            f"{self.schemas_dir}{self.note()}"
        )


@dataclass(frozen=True)
class Snapshot:
    store: SealedStore
    encoder: AvroEncoder
    fingerprints: dict[Key, bytes]
    # Each version's whole schema as parsed JSON: what must not change (a default, a decimal's scale, a
    # logical type change the bytes under the same Parsing Canonical Form, and so the same fingerprint).
    schemas: dict[Key, Any]


def load(
    schemas_dir: Path, mode: str, loaded: Snapshot | None = None, *, compiled: bool = True
) -> Snapshot | list[str]:
    """The directory as a sealed snapshot, or the problems that keep it from being used."""
    report = check_schemas(schemas_dir, mode)
    if not report.ok:
        return report.problems
    store = SealedStore(schemas_dir)
    encoder = AvroEncoder(store, compiled=compiled)
    keys = sorted((event_type, v) for event_type, versions in report.versions.items() for v in versions)
    problems: list[str] = []
    for key in keys:
        try:
            encoder.encoder_for(*key)  # loads and compiles: what the check read may have changed since
        except EventError as exc:
            problems.append(exc.message)
    if problems:
        return problems
    fingerprints = {key: store.get(*key).fingerprint for key in keys}
    schemas = {key: orjson.loads(store.get(*key).text) for key in keys}
    for (event_type, version), schema in (loaded.schemas if loaded else {}).items():
        now = schemas.get((event_type, version))
        if now is None:
            problems.append(
                f"{event_type} v{version} is in use and its file is gone: restart to drop a schema"
            )
        elif now != schema:
            problems.append(
                f"{event_type} v{version} changed since it was loaded (its JSON differs beyond white space "
                "and the order of keys): a published version never changes, write a new version instead"
            )
    if problems:
        return problems
    store.sealed = frozenset(keys)
    return Snapshot(store, encoder, fingerprints, schemas)


class SchemaSet:
    """The pipeline's snapshot of ``schemas_dir`` (module docstring): ``encoder`` and ``store`` are the
    current one's; :meth:`reload` replaces them when a re-read passes."""

    def __init__(
        self,
        schemas_dir: str | os.PathLike[str],
        mode: str,
        *,
        interval: float = RELOAD_INTERVAL,
        gap: float = RELOAD_GAP,
        clock: Callable[[], float] = time.monotonic,
        compiled: bool = True,
    ) -> None:
        self.schemas_dir, self.mode, self.compiled = Path(schemas_dir), mode, compiled
        self.interval, self.gap, self._clock = interval, gap, clock
        self._last_reload = -math.inf  # when the directory was last re-read (monotonic)
        self._missed: dict[Key, float] = {}  # when a miss of each pair last re-read it
        self._refused = ""  # the first problem of the last re-read, when it was not used
        first = load(self.schemas_dir, mode, compiled=compiled)
        if isinstance(first, list):
            raise ConfigError(
                f"setting 'schemas_dir': {self.schemas_dir} fails `cdc schemas check` ({mode}) with "
                f"{_problems(first)}; fix the files before `cdc run`",
                key="schemas_dir",
            )
        self._use(first)
        self.reloads = {"used": 0, "unchanged": 0, "refused": 0}  # re-reads, by outcome (for /metrics)

    @property
    def store(self) -> SealedStore:
        return self._current.store

    @property
    def encoder(self) -> AvroEncoder:
        return self._current.encoder

    def __len__(self) -> int:
        return len(self._current.fingerprints)

    def _use(self, snapshot: Snapshot) -> None:
        self._current = snapshot
        snapshot.store.note = self._note

    def _note(self) -> str:
        if self._last_reload == -math.inf:
            return ""
        ago = self._clock() - self._last_reload
        note = (
            f" (re-read {ago:.0f} s ago; a missing version re-reads it at most every {self.interval:g} s, "
            "SIGHUP at once"
        )
        return note + (f"; that re-read was not used: {self._refused})" if self._refused else ")")

    def reload_on_miss(self, event_type: str, version: int) -> bool:
        """The schema of an event is not loaded: re-read the directory, unless this pair did in the last
        ``interval`` seconds or any miss in the last ``gap`` seconds. True when a new snapshot is in use."""
        now, key = self._clock(), (event_type, version)
        if now - self._last_reload < self.gap or now - self._missed.get(key, -math.inf) < self.interval:
            return False
        if len(self._missed) >= MAX_MISSES:
            self._missed.clear()  # bounded: a stream of made-up event types must not grow the process
        self._missed[key] = now
        return self.reload(f"no schema loaded for {shown(event_type)} v{version}")

    def reload(self, why: str) -> bool:
        """Re-read the directory now; True when the new snapshot is in use (something was added)."""
        self._last_reload = self._clock()
        started = time.monotonic()
        found = load(self.schemas_dir, self.mode, self._current, compiled=self.compiled)
        took = time.monotonic() - started
        if isinstance(found, list):
            self.reloads["refused"] += 1
            self._refused = found[0]
            log.warning(
                "re-read %s (%s) and kept the %d schemas loaded before: it fails `cdc schemas check` "
                "(%s) with %s",
                self.schemas_dir,
                why,
                len(self),
                self.mode,
                _problems(found),
            )
            return False
        self._refused = ""
        added = sorted(found.fingerprints.keys() - self._current.fingerprints.keys())
        if not added:
            self.reloads["unchanged"] += 1
            log.info("re-read %s (%s): no new schema (%.0f ms)", self.schemas_dir, why, took * 1000)
            return False
        self.reloads["used"] += 1
        self._use(found)
        log.info(
            "re-read %s (%s): %d schemas, new: %s (%.0f ms)",
            self.schemas_dir,
            why,
            len(self),
            ", ".join(f"{event_type} v{version}" for event_type, version in added),
            took * 1000,
        )
        return True


def _problems(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    return f"{len(problems)} problem(s): {shown}" + (f"; and {more} more" if more > 0 else "")
