"""The package's layers, low to high: base < avro < stream < ops < cli. No module imports a higher layer.

- base: ``errors``, ``config``, ``config_loader`` and ``config_dsn``, ``logs``, ``pg``, ``fastpath``,
  ``trace_context``, ``trace_export``, ``trace_span``, ``trace_processor``, ``trace_stats`` and
  ``tracing`` (and the bare package ``cdc``);
- ``cdc.avro``: schemas, the encoder, compatibility, the registry, deserialization;
- ``cdc.consumer`` (for the services downstream) and ``cdc.stream`` (the pipeline) sit side by side above
  avro: neither imports the other;
- ``cdc.ops`` (setup, status, retention, dead letters) and the top-level ``outbox``, ``metrics`` and
  ``notify``;
- ``cli`` (and ``__main__``), which may import anything.

Every import counts: module level, inside a function, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cdc"

BASE = {
    "errors",
    "config",
    "config_loader",
    "config_dsn",
    "config_kafka",
    "logs",
    "pg",
    "fastpath",
    "trace_context",
    "trace_export",
    "trace_span",
    "trace_processor",
    "trace_stats",
    "tracing",
}
TOP = {"outbox", "metrics", "pipeline_metrics", "notify"}
CLI = {"cli", "__main__"}
WINGS = {"avro", "consumer", "stream", "ops"}

# Same rank, different layer: no import either way.
RANK = {"base": 0, "avro": 1, "consumer": 2, "stream": 2, "ops": 3, "top": 3, "cli": 4}


def layer_of(module: str) -> str:
    """The layer of a module of the package, by its dotted name (``cdc.avro.compat``: avro)."""
    parts = module.split(".")
    assert parts[0] == "cdc", module
    if len(parts) == 1:
        return "base"  # the package itself: its docstring and __version__
    head = parts[1]
    if head in WINGS:
        return head
    for name, members in (("base", BASE), ("top", TOP), ("cli", CLI)):
        if head in members:
            return name
    raise AssertionError(f"{module} belongs to no layer: add it to tests/unit/test_layers.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    base = PACKAGE.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(text: str, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of a ``cdc`` module in ``text``, a module of ``package``."""
    tree = ast.parse(text)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from cdc import setup` imports the module cdc.setup; `from cdc.avro import X` the wing.
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                found.append((node.lineno, dotted if _is_module(dotted) else base))
    return [(line, name) for line, name in found if name == "cdc" or name.startswith("cdc.")]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def upward_imports(source: str, text: str, *, package: bool = False) -> list[str]:
    """What the module ``source`` (its code: ``text``; ``package``: an ``__init__.py``) must not import."""
    own, problems = layer_of(source), []
    for line, target in imports_of(text, source if package else source.rpartition(".")[0]):
        theirs = layer_of(target)
        if theirs != own and RANK[theirs] >= RANK[own]:
            problems.append(f"line {line}: {source} ({own}) imports {target} ({theirs})")
    return problems


def test_every_module_has_a_layer() -> None:
    for path in modules():
        layer_of(module_name(path))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert upward_imports(module_name(path), text, package=path.name == "__init__.py") == []


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("cdc.stream.heartbeat", "from cdc.ops.setup import heartbeat_table\n"),  # stream -> ops
        ("cdc.stream.heartbeat", "from cdc.ops import setup\n"),
        ("cdc.config", "from cdc.avro.compat import MODES\n"),  # base -> avro
        ("cdc.consumer.processed", "from cdc.stream.source import connect\n"),  # consumer -> stream
        ("cdc.consumer.processed", "from cdc.ops.retention import DELETE_LOCKED\n"),  # consumer -> ops
        (
            "cdc.stream.pipeline",
            "def f():\n    from cdc.consumer import IdempotentConsumer\n",
        ),  # stream -> consumer
        (
            "cdc.avro.encoder",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cdc.stream.sink\n",
        ),
        ("cdc.avro.store", "from . import registry\nfrom ..ops import dlq\n"),  # relative: the second
    ],
)
def test_an_upward_import_is_found(source: str, text: str) -> None:
    assert len(upward_imports(source, text)) == 1


def test_imports_downward_and_within_a_wing_are_allowed() -> None:
    text = "from cdc.avro import SchemaStore\nfrom cdc.pg import connect\n"
    text += "from cdc.stream.sink import KafkaSink\n"
    assert upward_imports("cdc.ops.dlq", text) == []
    assert upward_imports("cdc.consumer", "from cdc.consumer.batches import x\n", package=True) == []


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere: module level, functions, TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in modules():
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {target for _, target in imports_of(path.read_text(encoding="utf-8"), package)} - {name}
    return graph


def test_no_two_modules_import_each_other() -> None:
    """A circle of two (config <-> config_loader, pipeline <-> lifecycle, sink <-> transactions were three)
    means one concept split in two files, or one in the wrong place. A package's __init__ re-exporting its
    modules is no circle."""
    graph = import_graph()
    circles = sorted(
        f"{a} <-> {b}"
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, set()) and not (a.startswith(b + ".") or b.startswith(a + "."))
    )
    assert circles == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of the import graph, of any length (the strongly connected components of more than one
    module, Tarjan's algorithm); a package's __init__ re-exporting its own modules is no edge."""
    edges = {
        a: {b for b in targets if b in graph and not (b.startswith(a + ".") or a.startswith(b + "."))}
        for a, targets in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_of_any_length() -> None:
    assert circles(import_graph()) == []


def test_a_circle_of_three_is_found() -> None:
    graph = {"cdc.a": {"cdc.b"}, "cdc.b": {"cdc.c"}, "cdc.c": {"cdc.a"}, "cdc.d": {"cdc.a"}}
    assert circles(graph) == [["cdc.a", "cdc.b", "cdc.c"]]
