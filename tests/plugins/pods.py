"""A rendered pod, run with podman: what a kubelet would do with the chart's Deployment or Job, without a
cluster. From the rendered object it takes the container's image, command and args, its environment (the
ConfigMaps of envFrom, then env, each Secret reference resolved to the test's own secrets), its mounted
Secret volumes (written as files with the volume's mode and the pod's fsGroup), and its securityContext as
podman flags (--user, --read-only, --cap-drop=all, no new privileges; seccomp RuntimeDefault is podman's
default profile). The network is the host's, where the local stack listens; a pod's own IP cannot be had
there, so `port` moves a second replica's metrics port (two pods would share one otherwise).

- `pod_from(objects, workload, secrets, workdir, images)`: the PodRun of a rendered Deployment or Job.
- `pods(run, what, port=None)` (fixture): starts it as a tests.plugins.podman.Container.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.plugins.pipeline import _register
from tests.plugins.podman import Container

Secrets = dict[str, dict[str, str]]  # Secret name -> key -> value


def split_password(dsn: str) -> tuple[str, str]:
    """A libpq DSN without its password, and the password (for a mounted file)."""
    params = conninfo_to_dict(dsn)
    password = str(params.pop("password", ""))
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None}), password


@dataclass
class PodRun:
    name: str
    image: str
    command: list[str]  # the container's command (replaces the image's entrypoint) or []
    args: list[str]
    env: dict[str, str]
    mounts: list[tuple[Path, str]]  # (host directory, mount path), read-only
    flags: list[str]  # the securityContext's podman flags
    grace: int  # terminationGracePeriodSeconds
    ports: dict[str, int] = field(default_factory=dict)  # name -> containerPort
    probes: dict[str, tuple[str, int]] = field(
        default_factory=dict
    )  # liveness|readiness|startup -> (path, port)

    def argv(self, name: str, image: str) -> tuple[list[str], dict[str, str]]:
        """`podman run` and the environment that carries the variables' values (never on the command line)."""
        argv = ["podman", "run", "--rm", "--name", name, "--network=host", *self.flags]
        for host, path in self.mounts:
            argv += ["--volume", f"{host}:{path}:ro"]
        for key in self.env:
            argv += ["--env", key]
        if self.command:
            argv += ["--entrypoint", self.command[0]]
        argv += [image, *self.command[1:], *self.args]
        return argv, dict(self.env)


def _container_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    sc = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    user, group = sc.get("runAsUser"), sc.get("runAsGroup")
    assert user is not None, "the rendered pod sets no runAsUser"
    if sc.get("runAsNonRoot"):
        assert int(user) != 0, "runAsNonRoot with runAsUser 0: the kubelet would refuse to start it"
    flags = [f"--user={user}:{group if group is not None else user}"]
    if sc.get("fsGroup") is not None:
        flags.append(f"--group-add={sc['fsGroup']}")
    if sc.get("readOnlyRootFilesystem"):
        # Kubernetes mounts no tmpfs of its own where podman would (/tmp, /run, /var/tmp).
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("capabilities", {}).get("drop") == ["ALL"]:
        flags.append("--cap-drop=all")
    if sc.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    seccomp = sc.get("seccompProfile", {}).get("type")
    assert seccomp in (None, "RuntimeDefault"), f"seccomp {seccomp}: not run here"
    return flags


def _secret_value(secrets: Secrets, ref: dict[str, Any]) -> str:
    name, key = ref["name"], ref["key"]
    assert name in secrets and key in secrets[name], (
        f"the pod references Secret {name} key {key}, which the test did not make "
        "(a kubelet would not start it: CreateContainerConfigError)"
    )
    return secrets[name][key]


def _write_secret_volume(
    volume: dict[str, Any], secrets: Secrets, directory: Path, fs_group: int | None
) -> None:
    secret = volume["secret"]
    directory.mkdir(parents=True)
    mode = int(secret.get("defaultMode", 0o644))
    data = secrets.get(secret["secretName"])
    assert data is not None, f"the pod mounts Secret {secret['secretName']}, which the test did not make"
    for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
        path = directory / item["path"]
        path.write_text(data[item["key"]])
        if fs_group is not None:
            os.chown(path, 0, fs_group)  # the kubelet gives the volume's files the pod's fsGroup
        path.chmod(int(item.get("mode", mode)))


def pod_from(
    objects: list[dict[str, Any]],
    workload: dict[str, Any],
    secrets: Secrets,
    workdir: Path,
    images: dict[str, str],
) -> PodRun:
    """The one container of a rendered Deployment or Job, resolved against the rendered ConfigMaps and the
    test's `secrets`; `images` maps the rendered image reference to a local image."""
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            env[var["name"]] = _secret_value(secrets, var["valueFrom"]["secretKeyRef"])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    run_dir = workdir / f"{workload['metadata']['name']}-{uuid.uuid4().hex[:6]}"
    mounts = []
    for mount in container.get("volumeMounts", []):
        assert "subPath" not in mount, "a subPath mount would not see a rotated Secret"
        volume = volumes[mount["name"]]
        assert "secret" in volume, f"volume {mount['name']}: only Secret volumes are run here"
        host = run_dir / mount["name"]
        _write_secret_volume(volume, secrets, host, fs_group)
        mounts.append((host, mount["mountPath"]))
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports", [])}
    probes = {}
    for kind in ("liveness", "readiness", "startup"):
        probe = container.get(f"{kind}Probe")
        if probe is not None:
            port = probe["httpGet"]["port"]
            probes[kind] = (probe["httpGet"]["path"], ports[port] if isinstance(port, str) else int(port))
    return PodRun(
        name=workload["metadata"]["name"],
        image=images[container["image"]],
        command=list(container.get("command", [])),
        args=[str(a) for a in container.get("args", [])],
        env=env,
        mounts=mounts,
        flags=_container_flags(pod, container),
        grace=int(pod.get("terminationGracePeriodSeconds", 30)),
        ports=ports,
        probes=probes,
    )


StartPod = Callable[..., Container]


@pytest.fixture
def pods(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartPod]:
    """`pods(run, what="pod", port=None)`: start a PodRun attached (log under tmp_path); `port` moves its
    metrics port (CDC_METRICS_PORT and the probes) for a second replica on the host's network. Every
    container is removed at teardown."""
    started: list[Container] = []

    def start(run: PodRun, what: str = "pod", port: int | None = None) -> Container:
        if port is not None:
            old = int(run.env["CDC_METRICS_PORT"])
            run.env["CDC_METRICS_PORT"] = str(port)
            run.probes = {k: (path, port if p == old else p) for k, (path, p) in run.probes.items()}
            run.ports = {k: port if p == old else p for k, p in run.ports.items()}
        name = f"cdc-pod-{uuid.uuid4().hex[:12]}"
        argv, env = run.argv(name, run.image)
        container = Container(argv, name, tmp_path / f"{what}-{len(started) + 1}.log", what, env)
        started.append(container)
        _register(request, container)
        return container

    try:
        yield start
    finally:
        for container in started:
            container.cleanup()
