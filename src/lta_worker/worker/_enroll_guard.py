"""The enrollment listener's defences, under uvicorn: a cap on connections with a deadline
for each request head (`Admission`, shared with the metrics server), accept() out of
descriptors reported as one rate-limited event, and a request with both `Content-Length`
and `Transfer-Encoding` refused with its connection closed."""

from __future__ import annotations

import asyncio
import errno
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

import anyio
from uvicorn.protocols.http.h11_impl import H11Protocol

from lta_worker.logs import get_logger
from lta_worker.worker._admission import Admission

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

log = get_logger("lta_worker.service")
# Seconds a client has to send a whole request head, after it connects or after an answer.
# uvicorn times a connection out only after an answer, and only while no byte comes: an
# idle or trickling client (slowloris) would hold its descriptor for good, and about 1,100
# of them took the passes' database and HTTP connections.
REQUEST_DEADLINE: Final = 10.0
# Connections kept at most (`Admission`: past it, a new one takes the place of the oldest
# still sending its head), and never more than a quarter of the process's descriptor limit:
# the rest is for the passes, the database and the service.
MAX_CONNECTIONS: Final = 256
# The listen backlog, which is also how many connections asyncio accepts in one go before
# those past the cap are closed: at most this many descriptors above the cap, for a moment.
BACKLOG: Final = 64
# When accept() fails for want of descriptors, asyncio (3.11) reports every attempt of its
# accept loop, each second: one `enroll.accept_failed` event per this many seconds instead.
ACCEPT_REPORT_EVERY: Final = 60.0
_SWEEP_EVERY: Final = 0.5  # how often heads past their deadline are looked for
_OUT_OF_RESOURCE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_cap(descriptor_limit: int) -> int:
    """The listener's connection cap under a soft RLIMIT_NOFILE of `descriptor_limit`."""
    if descriptor_limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, descriptor_limit // 4))


class AcceptFailures:
    """accept() calls refused for want of a resource: counted, reported at most once per
    `every` seconds (pure: `now` passed in)."""

    def __init__(self, every: float = ACCEPT_REPORT_EVERY) -> None:
        self.every = every
        self.count = 0  # refused since the last report
        self.reported_at: float | None = None

    def note(self, now: float) -> int | None:
        """One more refusal at `now`: the count to report (this one included) when a report
        is due, else None."""
        self.count += 1
        if self.reported_at is not None and now - self.reported_at < self.every:
            return None
        self.reported_at = now
        count, self.count = self.count, 0
        return count


class GatedProtocol(H11Protocol):
    """uvicorn's h11 protocol under the listener's `Admission`: at most its cap of
    connections, the oldest still waiting for its request head closed to make room, and
    each closed when its head has not come `REQUEST_DEADLINE` after the connect or the last
    answer (a request being answered is never cut)."""

    admission: ClassVar[Admission]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        admitted, evicted = self.admission.admit(self, time.monotonic())
        for other in evicted:
            cast(GatedProtocol, other).transport.close()
        if not admitted:  # every kept connection is being answered
            transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.admission.head_done(self)  # a request came: its answer is never cut

    def on_response_complete(self) -> None:
        # Before uvicorn reads a pipelined request (which `handle_events` then marks).
        self.admission.wait_again(self, time.monotonic())
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.release(self)
        super().connection_lost(exc)


def gated(admission: Admission) -> type[H11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to `admission`."""

    class Gated(GatedProtocol):
        pass

    Gated.admission = admission
    return Gated


async def sweep(admission: Admission) -> None:
    """Close, every `_SWEEP_EVERY` seconds, the connections whose head deadline passed."""
    while True:
        await anyio.sleep(_SWEEP_EVERY)
        for conn in admission.expired(time.monotonic()):
            cast(GatedProtocol, conn).transport.close()


def report_accept_failures(
    admission: Admission,
    previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An asyncio exception handler: accept() out of descriptors or memory becomes one
    `enroll.accept_failed` event per `ACCEPT_REPORT_EVERY` (never plain tracebacks on
    stderr); anything else goes to `previous` (or asyncio's default)."""
    failures = AcceptFailures()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCE:
            count = failures.note(time.monotonic())
            if count is not None:
                log.error(
                    "enroll.accept_failed",
                    error=errno.errorcode[exc.errno],
                    count=count,
                    connections=admission.kept,
                    max_connections=admission.cap,
                    hint="raise the descriptor limit (LimitNOFILE= of the unit), "
                    "and keep the listener behind a reverse proxy",
                )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handle


class RefuseAmbiguousFraming:
    """ASGI middleware: a request with both `Content-Length` and `Transfer-Encoding` gets a
    400 with `Connection: close` and never reaches the app.

    Its body's end is ambiguous, and a proxy in front may have framed it the other way: what
    h11 reads as the next request may be one smuggled in the body (RFC 9112 section 6.1 says
    to close the connection after such a request). h11 frames by `Transfer-Encoding`, and on
    `Connection: close` in the answer it closes the connection, so the bytes after the body
    are never read as a request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = b"Bad Request: both Content-Length and Transfer-Encoding\n"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
