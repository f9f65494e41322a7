"""PostgreSQL 13's heartbeats: a keepalive at or past the heartbeat's LSN counts as the heartbeat back."""

from __future__ import annotations

from cdc.config_loader import load_settings
from cdc.stream.failover import several_hosts
from cdc.stream.heartbeat import Heartbeat


def beat() -> Heartbeat:
    settings = load_settings(config_file=None, environ={}, overrides={"database_url": "postgresql://h/db"})
    return Heartbeat(settings)


def test_a_keepalive_past_the_heartbeat_counts_it_once():
    heartbeat = beat()
    heartbeat.by_keepalive = True
    heartbeat.awaiting_lsn = 1000
    heartbeat.keepalive(999)
    assert heartbeat.seen == 0 and heartbeat.awaiting_lsn == 1000
    heartbeat.keepalive(1000)
    heartbeat.keepalive(2000)
    assert heartbeat.seen == 1 and heartbeat.awaiting_lsn is None and heartbeat.last_seen > 0


def test_no_heartbeat_awaited_no_count():
    heartbeat = beat()
    heartbeat.keepalive(10**9)
    assert heartbeat.seen == 0


def test_several_hosts_is_read_from_the_dsn():
    assert several_hosts("host=a,b port=1,2 dbname=x target_session_attrs=read-write")
    assert several_hosts("postgresql://a:1,b:2/x")
    assert not several_hosts("postgresql://a:1/x")
