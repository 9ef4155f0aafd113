"""The service's HTTP interface (httpx): reads, token creation and drop, code exchange.

- `ApiClient` over an injected `httpx.AsyncClient`; `read` returns a raw `Answer` and never
  raises for HTTP or network trouble (`_client`);
- `long_term_credential` (`<token>.<client secret>`, built by `ApiClient` alone, which
  holds the client credentials), `usable_token`, `join_url` and the enrollment refusals'
  reasons, without httpx (`_wire`);
  `READ_PATHS` (`protocol`'s); `check_secure_url` (plain http only to loopback, `_wire`);
- `http_client`, the production client: timeouts, no proxy from the environment but an
  https one from the settings (`_http`);
- `WebhookSender` and `webhook_http_client`: signed POSTs to the webhook receiver
  (`_http`).
"""

from __future__ import annotations

from lta_worker.protocol import READ_PATHS
from lta_worker.upstream._client import ApiClient
from lta_worker.upstream._http import WebhookSender, http_client, webhook_http_client
from lta_worker.upstream._wire import (
    check_secure_url,
    create_reason,
    exchange_reason,
    join_url,
    long_term_credential,
    usable_token,
)

__all__ = [
    "READ_PATHS",
    "ApiClient",
    "WebhookSender",
    "check_secure_url",
    "create_reason",
    "exchange_reason",
    "http_client",
    "join_url",
    "long_term_credential",
    "usable_token",
    "webhook_http_client",
]
