"""The report of `cdc check` (:mod:`cdc.ops.check`): its findings, each ``ok``, ``warn`` or ``fail``, and the
exit code they make (the highest of the failures', 0 when `cdc run` would start)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdc.errors import CdcError, first_line

__all__ = ["CheckReport", "Finding"]

LEVELS = ("ok", "warn", "fail")


@dataclass(frozen=True, slots=True)
class Finding:
    area: str  # configuration, schemas, postgresql, kafka, registry
    level: str  # one of LEVELS
    text: str
    exit_code: int = 0  # a failure's: what `cdc run` would exit with


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    event_types: list[str] = field(default_factory=list)  # what the schemas know, for the topics' names

    def ok(self, area: str, text: str) -> None:
        self.findings.append(Finding(area, "ok", text))

    def warn(self, area: str, text: str) -> None:
        self.findings.append(Finding(area, "warn", text))

    def fail(self, area: str, error: CdcError) -> None:
        self.findings.append(Finding(area, "fail", str(error), error.exit_code))

    @contextmanager
    def step(self, area: str, passed: str | None = None) -> Iterator[None]:
        """Run one check: its CdcError (or a database error) is a failure of ``area``, and the next check
        runs; ``passed`` is said when it passes."""
        try:
            yield
        except CdcError as exc:
            self.fail(area, exc)
        except psycopg.Error as exc:
            self.fail(area, CdcError(f"PostgreSQL: {first_line(exc)}"))
        else:
            if passed is not None:
                self.ok(area, passed)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "fail"]

    @property
    def exit_code(self) -> int:
        return max((f.exit_code for f in self.failures), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "would_start": not self.failures,
            "exit_code": self.exit_code,
            "findings": [
                {"area": f.area, "level": f.level, "text": f.text, "exit_code": f.exit_code}
                for f in self.findings
            ],
        }

    def render(self) -> str:
        lines = [
            f"{f.level.upper() if f.level == 'fail' else f.level:<5} {f.area}: {f.text}"
            for f in self.findings
        ]
        warnings = sum(f.level == "warn" for f in self.findings)
        if self.failures:
            lines.append(
                f"cdc check: {len(self.failures)} problem(s), {warnings} warning(s): `cdc run` would not "
                "start"
            )
        else:
            lines.append(f"cdc check: `cdc run` would start ({warnings} warning(s))")
        return "\n".join(lines)
