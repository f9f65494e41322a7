"""A TCP proxy in front of a real service, so a test can take the service "down" and bring it back without
stopping the shared process other tests use (the schema registry, for one).

`tcp_proxy(host, port)` listens on a free loopback port and forwards every connection to host:port.
`stop()` closes the listener and cuts every open connection (clients then see "connection refused");
`start()` listens again on the same port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest


class Link:
    """Hooks on one proxied connection: ``request`` sees the client's bytes before they go upstream,
    ``response`` the server's before they go to the client (and may hold them back by blocking)."""

    def request(self, data: bytes) -> None:
        pass

    def response(self, data: bytes) -> None:
        pass


class FreezableLink(Link):
    """A connection that can go silent without closing: while frozen, nothing passes either way (what the
    peers send waits in the proxy), as through a NAT that forgot it or a hung load balancer."""

    def __init__(self) -> None:
        self.thawed = threading.Event()
        self.thawed.set()

    def request(self, data: bytes) -> None:
        self.thawed.wait()

    def response(self, data: bytes) -> None:
        self.thawed.wait()


class KafkaLink(FreezableLink):
    """Reads the Kafka request frames a client sends (int32 size, int16 api key, ...) and, once a request
    of ``proxy.hold_api_key`` passed, holds every response of this connection for ``proxy.hold_seconds``:
    the broker did the work, the client does not hear of it in time."""

    def __init__(self, proxy: KafkaProxy) -> None:
        super().__init__()
        self.proxy = proxy
        self.pending = b""
        self.skip = 0
        self.hold_until = 0.0

    def request(self, data: bytes) -> None:
        super().request(data)
        buf = self.pending + data
        pos = 0
        while True:
            if self.skip:
                step = min(self.skip, len(buf) - pos)
                pos += step
                self.skip -= step
                if self.skip:
                    break
            if len(buf) - pos < 6:
                break
            size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
            api_key = int.from_bytes(buf[pos + 4 : pos + 6], "big", signed=True)
            self.proxy.seen(self, api_key)
            pos += 4
            self.skip = size
        self.pending = buf[pos:]

    def response(self, data: bytes) -> None:
        super().response(data)
        wait = self.hold_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._links: list[FreezableLink] = []
        self._freeze_new = False

    def freeze(self, *, new_too: bool = False) -> None:
        """Forward nothing more on the open connections (and, ``new_too``, on those opened from now on),
        keeping them open: a silent network, not a closed one."""
        with self._lock:
            self._freeze_new = new_too
            for link in self._links:
                link.thawed.clear()

    def thaw(self) -> None:
        with self._lock:
            self._freeze_new = False
            for link in self._links:
                link.thawed.set()

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        self.thaw()  # frozen pipes would never see their sockets close
        listener, self._listener = self._listener, None
        if listener is not None:
            # close() alone does not wake a thread blocked in accept(), and the kernel would keep accepting.
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            link = self._link()
            threading.Thread(target=self._pipe, args=(client, upstream, link.request), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, link.response), daemon=True).start()

    def _link(self) -> Link:
        """What watches one connection's two directions: here, whether it is frozen."""
        return self._track(FreezableLink())

    def _track(self, link: FreezableLink) -> FreezableLink:
        with self._lock:
            self._links.append(link)
            if self._freeze_new:
                link.thawed.clear()
        return link

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, watch: Callable[[bytes], None]) -> None:
        try:
            while data := src.recv(65536):
                watch(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # A peer's close passes a frozen connection no more than its bytes do: a pipeline killed behind
            # a silent network leaves the server with a connection it believes open.
            watch(b"")
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[str, int], TcpProxy]]:
    proxies: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy((host, port))
        proxy.start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


class KafkaProxy(TcpProxy):
    """A proxy in front of a Kafka broker that advertises the proxy's port. ``hold_next(api_key, seconds)``:
    the next request of that kind goes through, and its connection's responses are held for ``seconds``."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(target)
        self.hold_api_key: int | None = None
        self.hold_seconds = 0.0
        self.held = threading.Event()

    def hold_next(self, api_key: int, seconds: float) -> None:
        self.hold_api_key, self.hold_seconds = api_key, seconds
        self.held.clear()

    def seen(self, link: KafkaLink, api_key: int) -> None:
        if api_key == self.hold_api_key:
            self.hold_api_key = None
            link.hold_until = time.monotonic() + self.hold_seconds
            self.held.set()

    def _link(self) -> Link:
        return self._track(KafkaLink(self))
