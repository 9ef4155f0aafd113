"""A transport of lanes: one single-connection httpx transport per concurrent request.

httpx's pool (httpcore's) hands an idle connection to every request waiting at that moment
until one of them has started on it; the others fail inside the pool and go round again,
each round asking every idle connection whether the server closed it. At the pass's
concurrency that doubled the CPU of the worker's HTTP layer (bench B1; issue 27's guard
rail is the worker's CPU per read at most 1.6 times plain httpx's). A lane is httpx's own
transport limited to one connection, lent to one request at a time, from its start until
its body is closed: no race, one idle check per request. Public interfaces only
(`AsyncHTTPTransport`, `handle_async_request`, `AsyncByteStream`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import httpx


class Lanes(httpx.AsyncBaseTransport):
    """`count` lanes, each an `httpx.AsyncHTTPTransport` of one kept-alive connection.

    A request waits for a free lane (first come, first served), so at most `count`
    connections are open: the pool's limit. TLS is verified and the environment not read.
    """

    def __init__(self, count: int, keepalive_expiry: float | None = 5.0) -> None:
        one = httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=keepalive_expiry
        )
        # One TLS context for all: each loads the CA bundle (milliseconds, and memory).
        tls = httpx.create_ssl_context(trust_env=False)
        self._lanes = [
            httpx.AsyncHTTPTransport(verify=tls, limits=one, trust_env=False) for _ in range(count)
        ]
        self._free = list(self._lanes)  # a stack: the lane used last has a warm connection
        self._ready = anyio.Semaphore(count)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` on a free lane, which stays its own until the body is closed."""
        await self._ready.acquire()
        lane = self._free.pop()
        try:
            response = await lane.handle_async_request(request)
        except BaseException:
            self._give_back(lane)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)  # an async transport's
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Lent(response.stream, lambda: self._give_back(lane)),
            extensions=response.extensions,
        )

    def _give_back(self, lane: httpx.AsyncHTTPTransport) -> None:
        self._free.append(lane)
        self._ready.release()

    async def aclose(self) -> None:
        """Close every lane's connection."""
        for lane in self._lanes:
            await lane.aclose()


class _Lent(httpx.AsyncByteStream):
    """A response body that gives its lane back once closed (at most once)."""

    def __init__(self, inner: httpx.AsyncByteStream, give_back: Callable[[], None]) -> None:
        self._inner = inner
        self._give_back: Callable[[], None] | None = give_back

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        give_back, self._give_back = self._give_back, None
        try:
            with anyio.CancelScope(shield=True):
                await self._inner.aclose()
        finally:
            if give_back is not None:
                give_back()
