"""`SimulatorTransport`: the simulator in-process, failing the way a real connection fails.

`httpx.ASGITransport` turns an exception in the app into an exception in the client. For a
simulated dropped connection that would be a `SimulatedDrop`, which no real client ever sees;
this transport gives instead what a client of the uvicorn-served simulator gets: the status
line and headers, then `httpx.RemoteProtocolError` while the body is read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
from starlette.types import ASGIApp

from lta_worker.simulator.faults import SimulatedDrop

if TYPE_CHECKING:
    from lta_worker.simulator.core import Simulator


class _CutStream(httpx.AsyncByteStream):
    """A body that yields what was sent, then fails as a connection closed mid-body does."""

    def __init__(self, partial: bytes, request: httpx.Request) -> None:
        self._partial = partial
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._partial:
            yield self._partial
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body",
            request=self._request,
        )


class SimulatorTransport(httpx.AsyncBaseTransport):
    """An httpx transport that serves requests from the simulator's ASGI app in-process.

    Args:
        target: A `Simulator` (its app is built) or an ASGI app from `build_app`.
    """

    def __init__(self, target: Simulator | ASGIApp) -> None:
        from lta_worker.simulator.core import Simulator
        from lta_worker.simulator.server import build_app

        app = build_app(target) if isinstance(target, Simulator) else target
        self._inner = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Serve one request; a simulated drop becomes a body that fails to read."""
        try:
            return await self._inner.handle_async_request(request)
        except SimulatedDrop as drop:
            return httpx.Response(
                drop.status,
                headers=drop.headers,
                stream=_CutStream(drop.partial, request),
                request=request,
            )

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()
