"""Builds the real collaborators from `Settings`: HTTP client, API client, store, vault, clock.

Commands and the service call these; tests build the same objects with their own
transport, database and clock instead.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from lta_worker import __version__
from lta_worker.config.settings import Settings
from lta_worker.worker.api import ApiClient, check_secure_url

USER_AGENT = f"lta-worker/{__version__}"


async def _refuse_insecure(request: httpx.Request) -> None:
    """Request hook: a last check that no request goes over plain http to a remote host."""
    check_secure_url(request.url)


def http_client(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for the service: timeouts from settings, a pool sized to
    `poll.concurrency`, no redirects followed, an `lta-worker/<version>` User-Agent, and
    plain http refused for non-loopback hosts at request time.

    Args:
        settings: the validated settings.
        transport: where requests go (default: the network); tests pass the simulator's.
    """
    service = settings.service
    concurrency = settings.poll.concurrency
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(
            service.read_timeout.total_seconds(),
            connect=service.connect_timeout.total_seconds(),
        ),
        # One connection per concurrent user turn, and one spare for enrollment and drop.
        limits=httpx.Limits(
            max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1
        ),
        follow_redirects=False,
        headers={"User-Agent": USER_AGENT},
        event_hooks={"request": [_refuse_insecure]},
    )


def api_client(settings: Settings, http: httpx.AsyncClient) -> ApiClient:
    """The API client over `http`."""
    return ApiClient(http, settings)


def utc_now() -> datetime:
    """The clock: an aware datetime in UTC."""
    return datetime.now(UTC)
