"""The container image that `make image` builds, run with podman against the local stack (host network), the
way an orchestrator runs it: as uid 10001, with a read-only root file system and nothing writable mounted
(not even /tmp), every capability dropped and no new privileges. `cdc setup` makes the outbox, `cdc run`
streams it with the compiled hot path (required by the image), answers its probes, and stops on SIGTERM with
exit 0 within `shutdown_timeout`."""

from __future__ import annotations

import time

import pytest

from tests.plugins.pipeline import free_port, wait_until
from tests.plugins.podman import ContainerOutbox, StartContainer, http_get, podman

pytestmark = [pytest.mark.integration, pytest.mark.image]

# What a restricted pod gets (the Helm chart's securityContext), as podman flags.
HARDENED = (
    "--user=10001:10001",
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
)
SHUTDOWN_TIMEOUT = 20.0


def test_the_image_runs_as_a_non_root_user_with_the_compiled_hot_path(cdc_image: str) -> None:
    config = podman("image", "inspect", "--format", "{{.Config.User}} {{json .Config.Entrypoint}}", cdc_image)
    user, entrypoint = config.stdout.split(" ", 1)
    assert user == "10001:10001"
    assert entrypoint.strip() == '["cdc"]'
    env = podman("image", "inspect", "--format", "{{json .Config.Env}}", cdc_image).stdout
    assert "CDC_FAST_PATH=required" in env


def test_the_image_sets_up_streams_answers_its_probes_and_stops_on_sigterm(
    containers: StartContainer, container_outbox: ContainerOutbox
) -> None:
    port = free_port()
    env = {
        **container_outbox.env,
        "CDC_METRICS_PORT": str(port),
        "CDC_METRICS_HOST": "0.0.0.0",
        "CDC_STATUS_INTERVAL": "1",
        "CDC_SHUTDOWN_TIMEOUT": f"{SHUTDOWN_TIMEOUT:g}",
    }
    setup = containers("setup", env=env, podman_args=HARDENED, what="setup")
    assert setup.wait(120) == 0, setup.tail()
    assert "slot" in setup.log()

    run = containers("run", env=env, podman_args=HARDENED, what="run")
    run.wait_for_log(r"streaming from slot", 60)
    box = container_outbox.attach()
    box.bulk(500, per_transaction=100)
    wait_until(lambda: container_outbox.published() == 500, 60, "500 events on the topic")

    assert wait_until(lambda: http_get(port, "/readyz"), 30, "/readyz") == (200, "ready\n")
    assert http_get(port, "/healthz") == (200, "alive\n")
    metrics = http_get(port, "/metrics")
    assert metrics is not None and "\ncdc_compiled_hot_path 1.0" in metrics[1]

    written = box.current_lsn()
    wait_until(lambda: box.confirmed_lsn() >= written, 30, "the slot confirmed past the events")
    run.signal("TERM")
    assert run.signalled_at is not None
    rc = run.wait(SHUTDOWN_TIMEOUT + 10)
    took = time.monotonic() - run.signalled_at
    assert rc == 0, run.tail()
    assert took < SHUTDOWN_TIMEOUT, f"exit {took:.1f} s after SIGTERM (shutdown_timeout {SHUTDOWN_TIMEOUT:g})"
    assert container_outbox.published() == 500  # nothing published twice by the stop
