"""The service's HTTP interface (httpx): reads, token creation and drop, code exchange.

- `ApiClient` over an injected `httpx.AsyncClient`; `read` returns a raw `Answer` and never
  raises for HTTP or network trouble (`_client`);
- `long_term_credential` (`<token>.<client secret>`, built by `ApiClient` alone, which
  holds the client credentials), `usable_token`, `join_url` and the paths of the
  interface, without httpx (`_wire`); `check_secure_url` (plain http only to loopback,
  `_client`);
- `http_client`, the production client: timeouts, no proxy from the environment but an
  https one from the settings (`_http`);
- `WebhookSender` and `webhook_http_client`: signed POSTs to the webhook receiver
  (`_webhook`).

Names are imported on first use (see `lta_worker._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lta_worker._lazy import lazy_attributes

if TYPE_CHECKING:
    from lta_worker.upstream._client import ApiClient, check_secure_url
    from lta_worker.upstream._http import http_client
    from lta_worker.upstream._webhook import WebhookSender, webhook_http_client
    from lta_worker.upstream._wire import (
        READ_PATHS,
        TOKEN_PREFIX,
        TOKENS_PATH,
        join_url,
        long_term_credential,
        usable_token,
    )

_NAMES = {
    "READ_PATHS": "._wire",
    "TOKENS_PATH": "._wire",
    "TOKEN_PREFIX": "._wire",
    "ApiClient": "._client",
    "check_secure_url": "._client",
    "join_url": "._wire",
    "long_term_credential": "._wire",
    "usable_token": "._wire",
    "http_client": "._http",
    "WebhookSender": "._webhook",
    "webhook_http_client": "._webhook",
}
__getattr__ = lazy_attributes(__name__, _NAMES)
__all__ = [
    "READ_PATHS",
    "TOKENS_PATH",
    "TOKEN_PREFIX",
    "ApiClient",
    "WebhookSender",
    "check_secure_url",
    "http_client",
    "join_url",
    "long_term_credential",
    "usable_token",
    "webhook_http_client",
]
