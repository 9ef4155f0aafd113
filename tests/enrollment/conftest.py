"""Fixtures for enrollment and lifecycle tests: the simulator in-process, a SQLite store,
a vault, and the worker's objects wired to them, all on one manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from lta_worker.config import Settings, build_settings
from lta_worker.enrollment import Enrollment, EnrollResult, Lifecycle
from lta_worker.secret import Secret
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    PLAIN_CLIENT_ID,
    PLAIN_CLIENT_SECRET,
    ManualClock,
    Simulator,
    SimulatorTransport,
)
from lta_worker.storage import Store, Vault
from lta_worker.upstream import ApiClient, http_client
from support.storage import keyring

BASE_URL = "https://api.sim.example"
AUTH_URL = "https://api.sim.example/auth"
REDIRECT_URI = "https://app.example/lta/callback"


def make_settings(client_id: str = DEMO_CLIENT_ID, public_url: str | None = None) -> Settings:
    """Settings pointing at the in-process simulator (the auth service under /auth), with the
    browser flow's callback under `public_url` when given."""
    redirect = REDIRECT_URI if public_url is None else f"{public_url}/lta/callback"
    return build_settings(
        {
            "service": {"base_url": BASE_URL, "auth_url": AUTH_URL},
            "client": {"id": client_id, "redirect_uri": redirect},
            "enroll": {} if public_url is None else {"public_url": public_url},
        }
    )


@dataclass
class World:
    """Everything a test drives: the simulator, the worker side, and the clock they share."""

    sim: Simulator
    clock: ManualClock
    settings: Settings
    store: Store
    vault: Vault
    http: httpx.AsyncClient
    api: ApiClient
    client_secret: Secret

    def enrollment(self, store: Store | None = None, api: ApiClient | None = None) -> Enrollment:
        """The worker's Enrollment, on another store or API client where given."""
        client, auth_url = self.settings.client, self.settings.service.auth_url
        return Enrollment(
            client,
            store or self.store,
            self.vault,
            api or self.api,
            self.clock.now,
            auth_url=auth_url,
        )

    def lifecycle(self, api: ApiClient | None = None) -> Lifecycle:
        """The worker's Lifecycle, on another API client where given."""
        return Lifecycle(
            self.settings.poll, self.store, self.vault, api or self.api, self.clock.now
        )

    async def enroll(self, user: str) -> EnrollResult:
        """Enroll `user` through the consent of the service's account `svc-<user>`."""
        enrollment = self.enrollment()
        return await enrollment.finish(
            user, await self.consent(enrollment.start(user), f"svc-{user}")
        )

    async def consent(self, url: str, sim_user: str, scopes: list[str] | None = None) -> str:
        """Queue a consent for `sim_user`, visit the consent URL, return the redirect."""
        self.sim.queue_consent(sim_user, scopes)
        response = await self.http.get(url)
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def token_of(self, user: str) -> Secret:
        """The stored long term token of `user`, decrypted."""
        row = self.store.get_user(user)
        assert row is not None
        assert row.token is not None
        return self.vault.decrypt(row.token, user=user)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> Simulator:
    return Simulator(clock=clock)


@pytest.fixture
def store(sqlite_store: Store) -> Store:
    """A migrated SQLite store (a copy of the session's template)."""
    return sqlite_store


async def make_world(
    sim: Simulator, clock: ManualClock, store: Store, client_id: str, secret: str, **settings_: str
) -> AsyncIterator[World]:
    """A World of the worker enrolled as `client_id` (settings: see `make_settings`)."""
    settings = make_settings(client_id, **settings_)
    async with http_client(settings.service, transport=SimulatorTransport(sim)) as http:
        yield World(
            sim=sim,
            clock=clock,
            settings=settings,
            store=store,
            vault=Vault(keyring()),
            http=http,
            api=ApiClient(http, settings.service, settings.client, Secret(secret)),
            client_secret=Secret(secret),
        )


@pytest.fixture
async def world(sim: Simulator, clock: ManualClock, store: Store) -> AsyncIterator[World]:
    """The worker enrolled as `demo-client` (long term mode open)."""
    async for made in make_world(sim, clock, store, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET):
        yield made


@pytest.fixture
async def plain_world(sim: Simulator, clock: ManualClock, store: Store) -> AsyncIterator[World]:
    """The worker enrolled as `plain-client` (long term mode not open)."""
    async for made in make_world(sim, clock, store, PLAIN_CLIENT_ID, PLAIN_CLIENT_SECRET):
        yield made
