"""The Helm chart deploy/helm/outbox-cdc, rendered without a cluster.

- `helm_bin`: helm, built by deploy/helm/install-helm.sh with `go install` (cached in ~/.cache/outbox-cdc;
  `make helm` builds it first in CI). No helm and no go is a skip on a developer's machine, a failure under
  CI=true.
- `render(*values_files, values=None, release="rel")`: `helm template` of the chart, as a list of objects.
- `helm_run(*args)`: any helm command on the chart (lint), its CompletedProcess.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.plugins.services import service_missing

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "outbox-cdc"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# The Kubernetes version the chart is rendered for (helm's .Capabilities); the manifests are validated
# against the schemas of the oldest and the newest supported minor versions (tests/deploy/test_chart.py).
KUBE_VERSION = "1.37.0"

Render = Callable[..., list[dict[str, Any]]]


def install_helm() -> str:
    """helm's path, built by deploy/helm/install-helm.sh unless cached; RuntimeError when it cannot be."""
    done = subprocess.run(
        ["bash", str(ROOT / "deploy/helm/install-helm.sh")], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"deploy/helm/install-helm.sh failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def template(helm: str, args: list[str], release: str = "rel") -> subprocess.CompletedProcess[str]:
    """`helm template <release> <chart> --kube-version ... <args>`."""
    return subprocess.run(
        [helm, "template", release, str(CHART), "--kube-version", KUBE_VERSION, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def render_values(
    helm: str, values: dict[str, Any], workdir: Path, release: str = "rel"
) -> list[dict[str, Any]]:
    """The chart's objects for `values` (written to a file under `workdir`)."""
    done = template(helm, values_args(workdir, (), values), release)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="session")
def helm_bin() -> str:
    try:
        return install_helm()
    except RuntimeError as exc:
        service_missing(str(exc))
        raise


@pytest.fixture(scope="session")
def helm_run(helm_bin: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120)

    return run


def values_args(tmp_path: Path, files: tuple[Path | str, ...], values: dict[str, Any] | None) -> list[str]:
    args: list[str] = []
    for file in files:
        args += ["-f", str(file)]
    if values is not None:
        path = tmp_path / f"values-{len(list(tmp_path.glob('values-*.json')))}.json"
        path.write_text(json.dumps(values))
        args += ["-f", str(path)]
    return args


@pytest.fixture
def render(helm_bin: str, tmp_path: Path) -> Render:
    """`render(*files, values={...}, release="rel")`: the chart's objects; an error of helm fails the test
    with its message (`render_error` returns it instead)."""

    def run(
        *files: Path | str, values: dict[str, Any] | None = None, release: str = "rel"
    ) -> list[dict[str, Any]]:
        done = template(helm_bin, values_args(tmp_path, files, values), release)
        assert done.returncode == 0, done.stderr
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    return run


@pytest.fixture
def render_error(helm_bin: str, tmp_path: Path) -> Callable[..., str]:
    """`render_error(*files, values={...})`: helm's error message for values it must refuse."""

    def run(*files: Path | str, values: dict[str, Any] | None = None) -> str:
        done = template(helm_bin, values_args(tmp_path, files, values))
        assert done.returncode != 0, f"helm accepted values it should refuse: {values}"
        return "\n".join(line for line in done.stderr.splitlines() if "symbolic link" not in line)

    return run
