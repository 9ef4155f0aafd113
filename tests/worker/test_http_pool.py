"""The production HTTP client's pool: its streams answer httpcore's idle check with one poll."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
import pytest

from lta_worker.config import build_settings
from lta_worker.upstream._http import _Backend, _Stream, http_client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Inner(httpcore.AsyncNetworkStream):
    """A stream over one end of a socket pair, counting its extra-info lookups."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lookups: list[str] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return self.sock.recv(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.sock.sendall(buffer)

    async def aclose(self) -> None:
        self.sock.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        return _Inner(self.sock)

    def get_extra_info(self, info: str) -> Any:
        self.lookups.append(info)
        return self.sock if info == "socket" else None


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def test_idle_stream_is_readable_only_once_the_peer_sends_or_closes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """`is_readable` is False on a quiet connection, True after data or the peer's close."""
    ours, theirs = pair
    stream = _Stream(_Inner(ours))
    assert stream.get_extra_info("is_readable") is False
    theirs.sendall(b"x")
    assert stream.get_extra_info("is_readable") is True
    ours.recv(1)
    theirs.close()
    assert stream.get_extra_info("is_readable") is True


def test_idle_check_looks_the_socket_up_once(pair: tuple[socket.socket, socket.socket]) -> None:
    """The socket is looked up when the stream is made, not on every idle check."""
    inner = _Inner(pair[0])
    stream = _Stream(inner)
    for _ in range(5):
        stream.get_extra_info("is_readable")
    assert inner.lookups == ["socket"]
    assert stream.get_extra_info("server_addr") is None
    assert inner.lookups == ["socket", "server_addr"]


def test_a_closed_socket_counts_as_readable(pair: tuple[socket.socket, socket.socket]) -> None:
    """A socket already closed (no descriptor) reads as the server's close, as httpcore's does."""
    stream = _Stream(_Inner(pair[0]))
    pair[0].close()
    assert stream.get_extra_info("is_readable") is True


async def test_stream_passes_reads_writes_and_tls_through(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """Reads, writes and the TLS upgrade go to the wrapped stream; TLS gives a wrapped stream."""
    ours, theirs = pair
    stream = _Stream(_Inner(ours))
    await stream.write(b"ping")
    assert theirs.recv(4) == b"ping"
    theirs.sendall(b"pong")
    assert await stream.read(4) == b"pong"
    upgraded = await stream.start_tls(ssl.create_default_context(), "example.com")
    assert isinstance(upgraded, _Stream)


async def test_production_client_pool_uses_the_backend() -> None:
    """`http_client` without an injected transport sends through a pool on `_Backend`."""
    settings = build_settings(
        {
            "service": {
                "base_url": "https://api.example",
                "auth_url": "https://account.example/auth",
            },
            "client": {"id": "demo-client"},
        }
    )
    async with http_client(settings) as http:
        transport = http._transport
        assert isinstance(transport, httpx.AsyncHTTPTransport)
        assert isinstance(transport._pool._network_backend, _Backend)  # type: ignore[attr-defined]
