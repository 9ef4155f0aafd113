"""The HTTP client of the webhook receiver: one signed POST per event (Standard Webhooks).

The same safe rules as the service's client: no proxy or credentials from the environment
(`trust_env=False`), no redirect followed, plain http only to a loopback host, and one total
deadline per delivery (`webhook.timeout`), so a receiver that drips its answer cannot hold a
pass. The body is the event's JSON; the headers `webhook-id` (the same on every attempt, for
the receiver to deduplicate), `webhook-timestamp` (this attempt) and `webhook-signature`
(`v1,` HMAC-SHA256 by `standardwebhooks`). The receiver's answer body is never read.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Final

import anyio
import httpx
from standardwebhooks.webhooks import Webhook

from lta_worker import __version__
from lta_worker.config import WebhookSettings
from lta_worker.domain import PendingEvent
from lta_worker.secret import Secret
from lta_worker.upstream._wire import refuse_insecure

USER_AGENT: Final = f"lta-worker/{__version__} webhook"


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
        headers={"User-Agent": USER_AGENT},
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
