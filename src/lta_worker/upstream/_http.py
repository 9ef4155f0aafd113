"""The production HTTP client of the service: timeouts, pool, no redirects, no proxy from the
environment, an https proxy from the settings, and plain http refused for remote hosts."""

from __future__ import annotations

import select
import socket
import ssl
from http.cookiejar import Cookie, CookieJar
from typing import Any

import httpcore
import httpx

from lta_worker import __version__
from lta_worker.config import Settings
from lta_worker.upstream._client import ServiceClient, check_secure_url

USER_AGENT = f"lta-worker/{__version__}"


class _NoCookies(CookieJar):
    """A cookie jar that keeps nothing.

    One client reads for every user: a cookie the service set in one user's answer would
    otherwise go out with every later request, whoever it is for, and let the service
    tie users together or hand one user's state to another. Nothing here needs a cookie.
    """

    def set_cookie(self, cookie: Cookie) -> None:
        """Keep nothing."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Read nothing from answers."""


async def _refuse_insecure(request: httpx.Request) -> None:
    """Request hook: a last check that no request goes over plain http to a remote host."""
    check_secure_url(request.url)


def _readable(sock: socket.socket | None) -> bool:
    """True when a read on `sock` would not block (data, or the peer's close), as httpcore's
    `is_socket_readable` decides it; a socket gone counts as readable (closed)."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's stream, with the raw socket looked up once instead of on every check.

    The pool asks every idle connection `is_readable` (did the server close it?) each
    time a request starts or ends: several times per read. httpcore's anyio stream finds
    the socket through anyio's typed attributes, which rebuild a dict and call
    `getpeername()` on each lookup; here it is one `poll()`.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return _readable(self._socket)
        return self._inner.get_extra_info(info)


class _Backend(httpcore.AnyIOBackend):
    """httpcore's anyio backend, its TCP streams wrapped in `_Stream`."""

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _Stream(await super().connect_tcp(*args, **kwargs))


class _Pool(httpcore.AsyncConnectionPool):
    """httpcore's pool, handing each idle connection to one waiting request at a time.

    httpcore 1.0 gives the first idle connection to every request waiting at that moment,
    and again at later passes until one of them has started on it: the others fail with
    `ConnectionNotAvailable` and go round again, each round a new pass that asks every idle
    connection whether the server closed it. With 8 readers that was two extra rounds per
    read, about a quarter of the worker's CPU (bench B1). Here a connection handed to a
    request is the request's until it is done: no other request gets it, and no pass
    closes it (as expired or surplus) before the request has started on it.

    Only for HTTP/1.1 (one request per connection); the pool is built with `http2=False`.
    The same fix is proposed upstream (encode/httpcore#1035, #1111).
    """

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        closing: list[httpcore.AsyncConnectionInterface] = []
        taken = {r.connection for r in self._requests if r.connection is not None}
        for connection in list(self._connections):
            if connection.is_closed():
                self._connections.remove(connection)
            elif connection in taken:
                continue
            elif connection.has_expired() or (
                connection.is_idle() and len(self._connections) > self._max_keepalive_connections
            ):
                self._connections.remove(connection)
                closing.append(connection)
        for waiting in [r for r in self._requests if r.is_queued()]:
            origin = waiting.request.url.origin
            free = [c for c in self._connections if c not in taken]
            reusable = [c for c in free if c.can_handle_request(origin) and c.is_available()]
            if reusable:
                connection = reusable[0]
            else:
                if len(self._connections) >= self._max_connections:
                    idle = [c for c in free if c.is_idle()]
                    if not idle:
                        continue  # waits until a connection is done
                    self._connections.remove(idle[0])  # another origin's: make room
                    closing.append(idle[0])
                connection = self.create_connection(origin)
                self._connections.append(connection)
            waiting.assign_to_connection(connection)
            taken.add(connection)
        return closing


def _transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport (TLS verified, no environment) over `_Pool` on `_Backend`.

    The pool is built as httpx builds it (same TLS context, limits, HTTP/1.1 only), then
    put in the place of httpx's own; if httpx no longer keeps its pool there, the
    transport stays as httpx made it.
    """
    ssl_context = httpx.create_ssl_context(trust_env=False)
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits, trust_env=False)
    if isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        transport._pool = _Pool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=_Backend(),
        )
    return transport


def _proxy_mounts(
    settings: Settings, limits: httpx.Limits
) -> dict[str, httpx.AsyncBaseTransport | None]:
    """Transports for `service.https_proxy`: https requests only, except `service.no_proxy`.

    Plain http is never proxied: it goes only to loopback (the simulator), and a proxy would
    see the credential in clear. An https request through the proxy is a CONNECT tunnel, so
    TLS (and the credential inside it) stays end to end.
    """
    service = settings.service
    if not service.https_proxy:
        return {}
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {}
    for host in (h.strip() for h in (service.no_proxy or "").split(",")):
        if host == "*":
            return {}
        name = host.lstrip(".")
        if not name:
            continue
        # `example.com` and `.example.com` both cover the domain and its subdomains.
        for pattern in (f"https://{name}", f"https://*.{name}"):
            try:
                httpx.URL(pattern)
            except (httpx.InvalidURL, ValueError):
                continue  # an entry httpx cannot match (a CIDR range): ignored
            mounts[pattern] = None
    proxied = httpx.AsyncHTTPTransport(proxy=service.https_proxy, limits=limits, trust_env=False)
    return {"https://": proxied, **mounts}


def http_client(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None
) -> ServiceClient:
    """An `httpx.AsyncClient` for the service: timeouts from settings, a pool sized to
    `poll.concurrency`, no redirects followed, no cookies kept (`_NoCookies`), an
    `lta-worker/<version>` User-Agent, and plain http refused for non-loopback hosts at
    request time.

    The environment is not read here (`trust_env=False`): proxies come from
    `service.https_proxy` and `service.no_proxy` only (the loader fills them from
    `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY`), and apply to https requests only. Without
    one, every request goes to one transport, which the `ServiceClient` names so that
    `ApiClient` sends to it directly.

    Args:
        settings: the validated settings.
        transport: where requests go (default: the network); tests pass the simulator's.
            An injected transport is used for every request, proxy or not.
    """
    service = settings.service
    concurrency = settings.poll.concurrency
    # One connection per concurrent user turn, and one spare for enrollment and drop.
    limits = httpx.Limits(
        max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1
    )
    mounts = _proxy_mounts(settings, limits) if transport is None else {}
    transport = transport or _transport(limits)
    return ServiceClient(
        direct=None if mounts else transport,  # several transports: `send` picks
        transport=transport,
        mounts=mounts,
        trust_env=False,
        timeout=httpx.Timeout(
            service.read_timeout.total_seconds(),
            connect=service.connect_timeout.total_seconds(),
        ),
        limits=limits,
        follow_redirects=False,
        cookies=_NoCookies(),
        # Only the codings `ApiClient` decodes within its cap (`upstream._decode`), even
        # when httpx could decode br or zstd (optional packages installed).
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate"},
        event_hooks={"request": [_refuse_insecure]},
    )
