"""The production HTTP client of the service: timeouts, pool, no redirects, no proxy from the
environment, an https proxy from the settings, and plain http refused for remote hosts."""

from __future__ import annotations

from http.cookiejar import Cookie, CookieJar
from typing import Any

import httpx

from lta_worker import __version__
from lta_worker.config import PollSettings, ServiceSettings
from lta_worker.upstream._wire import refuse_insecure

USER_AGENT = f"lta-worker/{__version__}"


class _NoCookies(CookieJar):
    """A cookie jar that keeps nothing: one client reads for every user, and a cookie from one
    user's answer would otherwise go out with the others' requests."""

    def set_cookie(self, cookie: Cookie) -> None:
        """Keep nothing."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Read nothing from answers."""


def _proxy_mounts(
    service: ServiceSettings, limits: httpx.Limits
) -> dict[str, httpx.AsyncBaseTransport | None]:
    """Transports for `service.https_proxy`: https requests only, except `service.no_proxy`.

    Plain http is never proxied: it goes only to loopback (the simulator), and a proxy would
    see the credential in clear. An https request through the proxy is a CONNECT tunnel, so
    TLS (and the credential inside it) stays end to end.
    """
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
    service: ServiceSettings,
    *,
    concurrency: int = PollSettings.concurrency,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for the service: timeouts from `[service]`, a pool sized to
    `concurrency`, no redirects, no cookies, an `lta-worker/<version>` User-Agent, plain
    http refused for non-loopback hosts, and proxies from `service.https_proxy` and
    `service.no_proxy` only (https requests only; the environment is not read here).

    Args:
        service: the `[service]` section.
        concurrency: the user turns that may read at once (`poll.concurrency`).
        transport: where requests go (default: the network); tests pass the simulator's.
            An injected transport is used for every request, proxy or not.
    """
    # One connection per concurrent user turn, and one spare for enrollment and drop.
    limits = httpx.Limits(
        max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1
    )
    mounts = _proxy_mounts(service, limits) if transport is None else {}
    # Without `transport`: httpx's own (TLS verified, HTTP/1.1, the environment not read).
    return httpx.AsyncClient(
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
        # No coding: `ApiClient` reads bodies as sent, within its cap, and refuses a coded
        # one (httpx would otherwise ask for gzip, deflate, and br or zstd when installed).
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        event_hooks={"request": [refuse_insecure]},
    )
