"""The service's HTTP interface (httpx): reads, token creation and drop, code exchange, and
the signed webhook sender."""

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
