"""The package is built of parts, not of towers (issue 39): two structural rules over cdc/, each shown to
fail on a planted violation.

1. No class of cdc/ extends another class of cdc/, except to add an exception to the one tree, to implement
   an interface (a Protocol or an ABC), or to make a plain value type (a frozen dataclass, a NamedTuple);
   and the one true subtype ``SealedStore(SchemaStore)``.
2. No module reads or writes another object's private attribute (``x._name`` where ``x`` is not ``self`` or
   ``cls``): a part is reached through its interface only. Library constants (``KafkaError._FENCED``), a
   module's own private functions (``os._exit``) and namedtuple's API (``_replace``) are not objects' state.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cdc"
ALLOWED_SUBTYPES = {("SealedStore", "SchemaStore")}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
CONSTANT = re.compile(r"_[A-Z0-9_]+")


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _allowed_base(base: type) -> bool:
    if issubclass(base, BaseException):
        return True
    if getattr(base, "_is_protocol", False) or inspect.isabstract(base):
        return True
    params = getattr(base, "__dataclass_params__", None)
    if dataclasses.is_dataclass(base) and params is not None and params.frozen:
        return True
    return issubclass(base, tuple) and hasattr(base, "_fields")  # a NamedTuple


def inheritance_violations(classes: list[type]) -> list[str]:
    found = []
    for cls in classes:
        for base in cls.__bases__:
            if not base.__module__.startswith("cdc"):
                continue
            if (cls.__name__, base.__name__) in ALLOWED_SUBTYPES or _allowed_base(base):
                continue
            found.append(f"{cls.__module__}.{cls.__name__}({base.__name__})")
    return found


def cdc_classes() -> list[type]:
    out = []
    for name in module_names():
        if name == "cdc.__main__":
            continue  # the command line: importing it runs it
        module = importlib.import_module(name)
        out += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
    return out


def private_reaches(source: str) -> list[str]:
    """``x._name`` in ``source`` where ``x`` is not self, cls, an imported module, or a library name."""
    tree = ast.parse(source)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if (
            not attr.startswith("_")
            or attr.startswith("__")
            or attr in NAMEDTUPLE_API
            or CONSTANT.fullmatch(attr)
        ):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_class_extends_another_but_an_interface_an_exception_or_a_value():
    assert inheritance_violations(cdc_classes()) == []


def test_the_inheritance_rule_fails_on_a_planted_tower():
    from cdc.stream.confirm import Confirmer

    class Tower(Confirmer):  # a long class cut into files: what the rule forbids
        pass

    Tower.__module__ = "cdc.stream.planted"
    assert inheritance_violations([Tower]) == ["cdc.stream.planted.Tower(Confirmer)"]


@pytest.mark.parametrize("name", module_names())
def test_no_module_reaches_into_another_objects_private_state(name):
    path = PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py")
    if not path.exists():
        path = PACKAGE.parent.joinpath(*name.split("."), "__init__.py")
    assert private_reaches(path.read_text()) == []


def test_the_private_rule_fails_on_a_planted_reach():
    planted = "import os\n\ndef f(part, self):\n    os._exit(0)\n    self._ok = part._txn\n    E._FENCED\n"
    assert private_reaches(planted) == ["line 5: part._txn"]
