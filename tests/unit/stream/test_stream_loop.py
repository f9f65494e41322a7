"""cdc.stream.stream_loop: what a new session sets (pure: the parts are stand-ins, no stream is read)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cdc.stream.heartbeat import Heartbeat
from cdc.stream.stream_loop import StreamLoop


class Emitter:
    def end(self) -> None:
        pass


def loop(heartbeat: Heartbeat) -> StreamLoop:
    parts: dict[str, Any] = dict.fromkeys(
        ("life", "acks", "router", "routes", "publisher", "sink", "confirmer", "failures", "dead_letters")
    )
    return StreamLoop(**parts, emitter=Emitter(), heartbeat=heartbeat, slot_watch=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("version", "by_keepalive"), [(130014, True), (140000, False), (180001, False)])
def test_before_14_a_session_follows_the_heartbeat_by_keepalive(version: int, by_keepalive: bool) -> None:
    """pgoutput carries no logical message before PostgreSQL 14: the heartbeat's own message never comes back,
    and a keepalive past its LSN stands for it (else cdc_heartbeats_seen stays at 0 on 13)."""
    heartbeat = Heartbeat(SimpleNamespace(heartbeat_interval=10.0))  # type: ignore[arg-type]
    session = loop(heartbeat)
    session.reset(server_version=version)
    assert heartbeat.by_keepalive is by_keepalive
    session.reset(server_version=150000)  # a reconnect to a server of another version (an upgrade)
    assert heartbeat.by_keepalive is False
