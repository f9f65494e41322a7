"""The README and docs/ name things that must exist: every relative link resolves (to a file, and to a heading
when it has an anchor), every `make X` is a target of the Makefile, every `cdc X` is a command with the
options shown beside it, every `key = value` names a setting, every `cdc_*` metric or table is in the code,
every `CDC_*` variable is a setting or the tooling's; and the README's example configuration loads as
written (docs/design.md's settings table is checked by test_design_doc.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import click
import pytest

from cdc.cli import main
from cdc.config import ColumnMap, Settings
from cdc.config_loader import _ENV, _TOOLING_ENV, load_settings
from cdc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "schemas" / "README.md", *(ROOT / "docs").glob("*.md")]
)
FENCE = re.compile(r"^\s*```")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split(path: Path) -> tuple[list[str], list[str]]:
    """The file's prose lines and its code-block lines (fences excluded)."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def code_texts(path: Path) -> Iterator[str]:
    """What a reader may copy: every `code span` of the prose, and every line of a code block."""
    prose, code = split(path)
    for paragraph in "\n".join(prose).split("\n\n"):
        yield from re.findall(r"`([^`]+)`", paragraph)
    yield from code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split(path)
    return {slug(m.group(1)) for line in prose if (m := re.match(r"^#{1,6} (.+)$", line))}


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc):
    prose, _ = split(doc)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", "\n".join(prose)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {doc_id(where)}")
    assert not broken, f"{doc_id(doc)}: " + "; ".join(broken)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_make_target_exists(doc):
    targets = make_targets()
    named = {t for text in code_texts(doc) for t in re.findall(r"(?:^|[\s;&(])make ([a-z][a-z0-9-]*)", text)}
    assert named <= targets, f"{doc_id(doc)} names make targets the Makefile lacks: {sorted(named - targets)}"


def options_of(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} | {
        "--help"
    }


def check_command(words: list[str]) -> list[str]:
    """The problems of one `cdc ...` line: a word that is no command of its group, an option it lacks."""
    command: click.Command = main
    path = ["cdc"]
    rest = words
    while isinstance(command, click.Group) and rest and re.fullmatch(r"[a-z][a-z|-]*", rest[0]):
        names = rest[0].split("|")
        missing = [n for n in names if n not in command.commands]
        if missing:
            return [f"`{' '.join(path)} {rest[0]}`: no command {missing} (has {sorted(command.commands)})"]
        command = command.commands[names[0]]
        path.append(rest[0])
        rest = rest[1:]
        if len(names) > 1:
            return []  # alternatives: their options are not told apart
    if command is main:
        return []
    problems = []
    for word in rest:
        if word in ("&&", ";", "|", "#") or word.startswith("#"):
            break
        for option in re.findall(r"--[a-z][a-z0-9-]*", word):
            if option not in options_of(command):
                problems.append(f"`{' '.join(path)}` has no option {option}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_cdc_command_and_option_exists(doc):
    problems = []
    for text in code_texts(doc):
        for piece in re.split(r"&&|;| \| ", text):
            for match in re.finditer(r"(?:^|[\s/(])cdc ((?:[a-z|-]+)(?: .*)?)$", piece):
                problems += check_command(match.group(1).split())
    assert not problems, f"{doc_id(doc)}: " + "; ".join(problems)


def code_names() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8")
        for p in [*(ROOT / "cdc").rglob("*.py"), *(ROOT / "slot_setup").glob("*.sql")]
    )


# Example names the docs give to things the reader creates, and compiled-loop.md's prototype target.
EXAMPLE_NAMES = {"cdc_pipeline", "cdc_stream", "cdc_role", "cdc_fastpath"}


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_cdc_metric_and_table_is_in_the_code(doc):
    code = code_names()
    named = set(re.findall(r"(?<![\w.-])(cdc_[a-z_]+[a-z])(?![\w.*])", doc.read_text(encoding="utf-8")))
    unknown = set()
    for name in named - EXAMPLE_NAMES:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if f'"{base}' not in code and f"'{base}" not in code and not re.search(rf"\b{base}\b", code):
            unknown.add(name)
    assert not unknown, f"{doc_id(doc)} names what the code does not have: {sorted(unknown)}"


# `name = value` in the docs that is not ours: PostgreSQL's settings and catalog columns, the TOML of a column
# map, setuptools-rust's key (compiled-loop.md).
NOT_SETTINGS = {
    "wal_level",
    "track_commit_timestamp",
    "hot_standby_feedback",
    "log_replication_commands",
    "primary_conninfo",
    "primary_slot_name",
    "sync_replication_slots",
    "synchronized_standby_slots",
    "failover",
    "wal_status",
    "rolname",
    "preset",
    "optional",
}


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_setting_written_as_key_equals_value_exists(doc):
    ours = {f.name for f in fields(Settings)} | {f.name for f in fields(ColumnMap)}
    prose, _ = split(doc)
    named = {
        key
        for paragraph in "\n".join(prose).split("\n\n")
        for span in re.findall(r"`([^`]+)`", paragraph)
        for key in re.findall(r"(?:^|[\s{,(])([a-z][a-z0-9_]*) = ", span)
    }
    unknown = named - ours - NOT_SETTINGS
    assert not unknown, f"{doc_id(doc)} sets what is no setting: {sorted(unknown)}"


def tooling_text() -> str:
    files = [
        ROOT / "Makefile",
        ROOT / "docker-compose.yml",
        ROOT / ".ci" / "run",
        *(ROOT / "stack").rglob("*.sh"),
    ]
    files += [*(ROOT / "tests").rglob("*.py")]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_cdc_variable_is_a_setting_or_the_toolings(doc):
    tooling = tooling_text()
    unknown = set()
    for name in set(re.findall(r"\bCDC_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text(encoding="utf-8"))):
        if name in _ENV or name == "CDC_CONFIG" or name.startswith("CDC_KAFKA_"):
            continue
        if name.startswith(_TOOLING_ENV) and re.search(rf"\b{name}\b", tooling):
            continue
        unknown.add(name)
    assert not unknown, f"{doc_id(doc)} names variables that nothing reads: {sorted(unknown)}"


def readme_block(language: str, containing: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for block in re.findall(rf"^( *)```{language}\n(.*?)^\1```", text, re.M | re.S):
        indent, body = block
        if containing in body:
            return "\n".join(line.removeprefix(indent) for line in body.splitlines())
    raise AssertionError(f"no ```{language} block with {containing!r} in README.md")


def readme_config(tmp_path: Path) -> Path:
    """The README's cdc.toml, with the files it names (under /etc/outbox-cdc/) made in tmp_path."""
    text = readme_block("toml", "[kafka]")
    (tmp_path / "schemas").mkdir()
    config = tmp_path / "cdc.toml"
    config.write_text(text.replace("/etc/outbox-cdc/", f"{tmp_path}/"), encoding="utf-8")
    return config


def test_the_readme_configuration_loads_with_the_password_from_the_environment(tmp_path):
    config = readme_config(tmp_path)
    settings = load_settings(config_file=config, environ={"CDC_KAFKA_SASL_PASSWORD": "s3cret"}, overrides={})
    assert settings.kafka.extra["security.protocol"] == "SASL_SSL"
    assert settings.kafka.extra["sasl.password"] == "s3cret"
    assert "password" not in settings.database_url  # PGPASSWORD, never the file
    assert settings.topic_replication_factor == 3


def test_the_readme_configuration_asks_for_the_password_it_leaves_out(tmp_path):
    with pytest.raises(ConfigError, match="CDC_KAFKA_SASL_PASSWORD"):
        load_settings(config_file=readme_config(tmp_path), environ={}, overrides={})
