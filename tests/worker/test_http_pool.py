"""The production HTTP client's pool: one request per idle connection at a time, and streams
that answer httpcore's idle check with one poll."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Any

import anyio
import httpcore
import httpx
import pytest

from lta_worker.config import build_settings
from lta_worker.upstream._http import _Backend, _Pool, _Stream, http_client

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
    """`http_client` without an injected transport sends through `_Pool` on `_Backend`, with
    TLS verified and a connection per concurrent turn plus one."""
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
        pool = transport._pool
        assert isinstance(pool, _Pool)
        assert isinstance(pool._network_backend, _Backend)
        assert pool._ssl_context.verify_mode == ssl.CERT_REQUIRED
        assert pool._ssl_context.check_hostname
        assert pool._max_connections == settings.poll.concurrency + 1
        assert not pool._http2


ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class _Canned(httpcore.AsyncNetworkStream):
    """A server in memory that answers every request with a short 200 and keeps the
    connection; each read and write lets other tasks run, as a socket's would."""

    def __init__(self) -> None:
        self.pending = b""
        self.requests = 0
        self.closed = False
        self.server_closed = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        await anyio.lowlevel.checkpoint()
        data, self.pending = self.pending[:max_bytes], self.pending[max_bytes:]
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await anyio.lowlevel.checkpoint()
        if buffer.endswith(b"\r\n\r\n"):  # a request's head (GETs have no body)
            self.requests += 1
            self.pending += ANSWER

    async def aclose(self) -> None:
        self.closed = True

    def get_extra_info(self, info: str) -> Any:
        return self.server_closed if info == "is_readable" else None


class _CannedBackend(httpcore.AsyncNetworkBackend):
    """Connects to `_Canned` servers, keeping each for the test to look at."""

    def __init__(self) -> None:
        self.streams: list[_Canned] = []

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        await anyio.lowlevel.checkpoint()
        self.streams.append(_Canned())
        return self.streams[-1]

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class _Counted(_Pool):
    """`_Pool`, counting the requests its connections turned away (`ConnectionNotAvailable`)."""

    refused = 0

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        connection = super().create_connection(origin)
        send = connection.handle_async_request

        async def counted(request: httpcore.Request) -> httpcore.Response:
            try:
                return await send(request)
            except httpcore.ConnectionNotAvailable:
                self.refused += 1
                raise

        connection.handle_async_request = counted  # type: ignore[method-assign]
        return connection


async def _get(pool: httpcore.AsyncConnectionPool, answers: list[bytes]) -> None:
    async with pool.stream("GET", "http://127.0.0.1:9/x") as response:
        answers.append(await response.aread())


async def test_concurrent_requests_never_share_an_idle_connection() -> None:
    """8 readers, 5 requests each, on 8 connections: no request is handed a connection that
    another one takes first, and no reader needs a connection of its own beyond the 8."""
    backend = _CannedBackend()
    answers: list[bytes] = []
    async with _Counted(max_connections=8, network_backend=backend) as pool:

        async def reader() -> None:
            for _ in range(5):
                await _get(pool, answers)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(reader)
    assert answers == [b"ok"] * 40
    assert pool.refused == 0
    assert len(backend.streams) <= 8
    assert sum(s.requests for s in backend.streams) == 40


async def test_requests_beyond_the_limit_wait_for_a_connection() -> None:
    """With 2 connections, 6 requests at once are all answered, on those 2 connections."""
    backend = _CannedBackend()
    answers: list[bytes] = []
    pool = _Counted(max_connections=2, network_backend=backend)
    async with pool, anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(_get, pool, answers)
    assert answers == [b"ok"] * 6
    assert len(backend.streams) == 2
    assert pool.refused == 0


async def test_a_connection_the_server_closed_is_replaced() -> None:
    """An idle connection whose server closed it is closed and dropped; the next request
    goes over a new one."""
    backend = _CannedBackend()
    answers: list[bytes] = []
    async with _Pool(max_connections=2, network_backend=backend) as pool:
        await _get(pool, answers)
        backend.streams[0].server_closed = True
        await _get(pool, answers)
        assert len(pool.connections) == 1
    assert answers == [b"ok", b"ok"]
    assert [s.requests for s in backend.streams] == [1, 1]
    assert backend.streams[0].closed


async def test_an_idle_connection_to_another_host_makes_room() -> None:
    """At the limit, a request to another host closes an idle connection to make its own."""
    backend = _CannedBackend()
    async with _Pool(max_connections=1, network_backend=backend) as pool:
        await pool.request("GET", "http://127.0.0.1:9/x")
        await pool.request("GET", "http://127.0.0.2:9/x")
        assert len(pool.connections) == 1
    assert backend.streams[0].closed
    assert [s.requests for s in backend.streams] == [1, 1]
