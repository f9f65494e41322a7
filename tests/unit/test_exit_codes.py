"""One rule for exit codes: 2 only when a restart cannot help (docs/design.md, "Exit codes"). The table there
names the errors of each cause: each must exit with the code the table gives, and the example systemd unit
must restart exactly the codes after which a restart helps."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

import cdc.errors as errors
from tests.plugins.systemd_unit import restart_policy

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "examples" / "systemd" / "outbox-cdc.service"


def table() -> list[tuple[str, list[str], str, str]]:
    """(cause, error class names, exit, a restart helps) of each row of the exit-code table."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("cause", "---"):
            continue
        cause, error, code, helps, _ = cells
        rows.append((cause, re.findall(r"`(\w+Error|StartupRefusal)`", error), code, helps))
    return rows


def test_the_table_has_the_causes_of_the_issue():
    causes = {cause: (names, code) for cause, names, code, _ in table()}
    assert len(causes) >= 15
    kafka = next(v for c, v in causes.items() if c.startswith("Kafka unreachable at the start"))
    assert kafka == (["BrokerUnreachableError"], "1")


@pytest.mark.parametrize("row", table(), ids=lambda row: row[0][:40])
def test_each_error_exits_as_the_table_says(row):
    cause, names, code, helps = row
    assert helps.startswith(("yes", "no", "once", "—")), cause
    # Exit 2 exactly where a restart does not help.
    assert (code == "2") == helps.startswith("no"), f"{cause}: exit {code}, a restart helps: {helps}"
    for name in names:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.CdcError)
        assert str(cls.exit_code) == code, f"{name} exits {cls.exit_code}, the table says {code} ({cause})"


def test_no_outage_is_a_refusal():
    """What an outage raises must never become exit 2, whatever class tree it is moved to."""
    for cls in (errors.BrokerUnreachableError, errors.SourceConnectionError, errors.DeliveryError):
        assert cls.exit_code == 1, cls
        assert not issubclass(cls, errors.StartupRefusal | errors.AccessDeniedError | errors.ConfigError)


def test_the_systemd_unit_restarts_exactly_where_a_restart_helps():
    policy = restart_policy(UNIT)
    refusals = {int(code) for _, _, code, helps in table() if helps.startswith("no")}
    assert refusals == {2}
    assert policy.prevent == frozenset(refusals)
    assert policy.restarts(1) and policy.restarts(-signal.SIGKILL) and policy.restarts(-signal.SIGABRT)
    assert not policy.restarts(2)
    # An outage may last longer than any start limit would allow: the unit must never give up by itself.
    assert policy.start_limit_interval == 0 or policy.restart_sec * policy.start_limit_burst > (
        policy.start_limit_interval
    )
