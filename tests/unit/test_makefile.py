"""`make install` notices what decides whether the compiled hot path is built (issue 43, item 3): a cargo
installed after a pure-Python install, or a compiled extension that is gone, makes the install run again;
nothing changed, it does nothing. Asked of the real Makefile with `make -q` (nothing is run) in a scratch
tree, with a fake cargo."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for name in ("pyproject.toml", "rust/Cargo.toml", "rust/src/lib.rs"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "cdc").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path


def up_to_date(tree: Path) -> bool:
    """`make -q install`: 0 when nothing would be done. No cargo but the fake one in $HOME/.cargo/bin."""
    path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "cargo").exists())
    env = {"PATH": path, "HOME": str(tree / "home")}
    done = subprocess.run(["make", "-q", "install"], cwd=tree, env=env, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def installed(tree: Path, *state: str) -> None:
    """The stamps an install leaves, ``state`` being what it found (cargo version or none, built or not)."""
    venv = tree / ".venv"
    venv.mkdir(exist_ok=True)
    for old in venv.glob(".fastpath-*"):
        old.unlink()
    (venv / f".fastpath-cargo-{'-'.join(state)}").touch()
    time.sleep(0.01)
    (venv / ".installed").touch()


def install_cargo(tree: Path, version: str) -> None:
    cargo = tree / "home" / ".cargo" / "bin" / "cargo"
    cargo.parent.mkdir(parents=True, exist_ok=True)
    cargo.write_text(f"#!/bin/sh\necho 'cargo {version} (fake 2026-01-01)'\n")
    cargo.chmod(0o755)


def test_a_cargo_installed_after_a_pure_python_install_makes_the_install_run_again(tree):
    installed(tree, "none", "unbuilt")
    assert up_to_date(tree), "nothing changed: nothing to do"
    install_cargo(tree, "1.95.0")
    assert not up_to_date(tree), "cargo is here now: the install must run again and build the extension"


def test_a_built_extension_is_up_to_date_and_a_missing_one_is_built_again(tree):
    install_cargo(tree, "1.95.0")
    (tree / "cdc" / "_fastpath.abi3.so").touch()
    installed(tree, "1.95.0", "built")
    assert up_to_date(tree)
    (tree / "cdc" / "_fastpath.abi3.so").unlink()
    assert not up_to_date(tree)


def test_a_build_that_failed_with_this_cargo_is_not_retried_at_every_make(tree):
    install_cargo(tree, "1.95.0")
    installed(tree, "1.95.0", "unbuilt")
    assert up_to_date(tree)
    install_cargo(tree, "1.96.0")  # an upgrade may build it: tried once more
    assert not up_to_date(tree)
