"""The production HTTP clients (the service's, the webhook receiver's: both refuse plain
http to a host that is not loopback) and the Standard Webhooks sender (docs/webhooks.md).
"""

from __future__ import annotations

import json
from datetime import datetime
from http.cookiejar import Cookie, CookieJar
from typing import Any

import anyio
import httpx
from standardwebhooks.webhooks import Webhook

from lta_worker import __version__
from lta_worker.config import PollSettings, ServiceSettings, WebhookSettings
from lta_worker.domain import PendingEvent
from lta_worker.secret import Secret
from lta_worker.upstream._wire import refuse_insecure

USER_AGENT = f"lta-worker/{__version__}"


class _NoCookies(CookieJar):
    """A cookie jar that keeps nothing: one user's cookie must never go with another's request."""

    def set_cookie(self, cookie: Cookie) -> None:
        """Keep nothing."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Read nothing from answers."""


def _proxy_mounts(
    service: ServiceSettings, limits: httpx.Limits
) -> dict[str, httpx.AsyncBaseTransport | None]:
    """Transports for `service.https_proxy`: https requests only (a CONNECT tunnel keeps TLS
    end to end; a plain http proxy would see the credential), except `service.no_proxy`."""
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
    """An `httpx.AsyncClient` for the service: no redirects, no cookies, a pool sized to
    `poll.concurrency`, proxies from `service.https_proxy` only (never the environment);
    an injected `transport` (tests: the simulator's) serves every request.
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


def webhook_http_client(
    webhook: WebhookSettings, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for the receiver (timeouts from `webhook.timeout`)."""
    seconds = webhook.timeout.total_seconds()
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        timeout=httpx.Timeout(seconds),
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
        follow_redirects=False,
        headers={"User-Agent": f"{USER_AGENT} webhook"},
        event_hooks={"request": [refuse_insecure]},
    )


class WebhookSender:
    """Signs and POSTs events to `webhook.url`; never raises for the receiver's trouble."""

    def __init__(self, http: httpx.AsyncClient, webhook: WebhookSettings, secret: Secret) -> None:
        if webhook.url is None:
            raise ValueError("WebhookSender needs webhook.url")
        self._http = http
        self._url = webhook.url
        self._timeout = webhook.timeout.total_seconds()
        self._signer = Webhook(secret.reveal())

    def signed(self, event: PendingEvent, now: datetime) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one attempt at `now` (aware UTC)."""
        body = json.dumps(event.payload, separators=(",", ":"), allow_nan=False)
        headers = {
            "content-type": "application/json",
            "webhook-id": event.event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(event.event_id, now, body),
        }
        return body.encode(), headers

    async def send(self, event: PendingEvent, now: datetime) -> str | None:
        """POST the event; None when the receiver acknowledged it (2xx), else why not."""
        body, headers = self.signed(event, now)
        try:
            with anyio.fail_after(self._timeout):
                request = self._http.build_request("POST", self._url, content=body, headers=headers)
                response = await self._http.send(request, stream=True)
                await response.aclose()  # the answer's body is never read
        except TimeoutError:
            return "timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}"
