"""Drop and forget through the in-process simulator: upstream DELETE, local deletion, purge."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from lta_worker.errors import EX_USAGE, UnknownUserError
from lta_worker.simulator import DEMO_CLIENT_ID, SimulatorTransport
from lta_worker.storage import SnapshotWrite, UserUpdate
from lta_worker.worker.api import ApiClient, long_term_credential
from lta_worker.worker.lifecycle import Lifecycle
from lta_worker.worker.wiring import http_client

from .conftest import World

pytestmark = pytest.mark.anyio


async def enroll(world: World, user: str) -> None:
    enrollment = world.enrollment()
    await enrollment.finish(user, await world.consent(enrollment.start(user), f"svc-{user}"))


def store_results(world: World, user: str) -> None:
    """Write two snapshots and a history row for `user`, as a pass would."""
    row = world.store.get_user(user)
    assert row is not None
    for minutes, value in ((0, 1), (60, 2)):
        now = world.clock.now() + timedelta(minutes=minutes)
        world.store.apply(
            [
                UserUpdate(
                    user_id=row.id,
                    state="active",
                    next_due_at=now + timedelta(hours=1),
                    consecutive_failures=0,
                    last_outcome="ok",
                    last_polled_at=now,
                    snapshots=(
                        SnapshotWrite("stats", "ok", {"count": value}, now),
                        SnapshotWrite("latest-change", "none", None, now),
                    ),
                )
            ]
        )


async def test_drop_sends_delete_with_the_credential(world: World) -> None:
    """drop DELETEs upstream with the user's credential, then deletes the token locally."""
    await enroll(world, "alice")
    token = world.token_of("alice")
    world.sim.clear_requests()
    result = await world.lifecycle().drop("alice")
    assert (result.upstream, result.status, result.previous_state) == ("ok", 204, "active")
    deletes = [r for r in world.sim.requests() if r.method == "DELETE"]
    assert len(deletes) == 1
    assert deletes[0].path == "/auth/api/long-term-access/tokens"
    assert (deletes[0].auth, deletes[0].client, deletes[0].user) == (
        "long_term",
        DEMO_CLIENT_ID,
        "svc-alice",
    )
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token) == ("dropped", None)
    after = await world.api.read("stats", long_term_credential(token, world.client_secret))
    assert after.status == 401


async def test_drop_works_locally_when_upstream_fails(world: World) -> None:
    """An unreachable service: the failure is reported, the local token is gone anyway."""
    await enroll(world, "alice")
    inner = SimulatorTransport(world.sim)

    async def failing_delete(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            raise httpx.ConnectError("connection refused")
        return await inner.handle_async_request(request)

    async with http_client(world.settings, transport=httpx.MockTransport(failing_delete)) as http:
        lifecycle = Lifecycle(
            world.settings,
            world.store,
            world.vault,
            ApiClient(http, world.settings),
            world.clock.now,
            client_secret=world.client_secret,
        )
        result = await lifecycle.drop("alice")
    assert result.upstream == "failed"
    assert result.error is not None
    assert "connect" in result.error
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token) == ("dropped", None)


async def test_drop_reports_an_unexpected_status(world: World) -> None:
    """A non-2xx answer to the DELETE is reported as failed; the local token is gone."""
    await enroll(world, "alice")

    def teapot(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500)

    async with http_client(world.settings, transport=httpx.MockTransport(teapot)) as http:
        lifecycle = Lifecycle(
            world.settings,
            world.store,
            world.vault,
            ApiClient(http, world.settings),
            world.clock.now,
            client_secret=world.client_secret,
        )
        result = await lifecycle.drop("alice")
    assert (result.upstream, result.status) == ("failed", 500)
    row = world.store.get_user("alice")
    assert row is not None
    assert row.token is None


async def test_drop_without_a_token_skips_upstream(world: World) -> None:
    """A user already dropped (no token) is not sent upstream; dropping again is harmless."""
    await enroll(world, "alice")
    await world.lifecycle().drop("alice")
    world.sim.clear_requests()
    result = await world.lifecycle().drop("alice")
    assert (result.upstream, result.status, result.previous_state) == ("skipped", None, "dropped")
    assert world.sim.requests() == []


async def test_drop_of_a_revoked_user_skips_upstream(world: World) -> None:
    """A revoked user (token already deleted) is dropped locally without a DELETE."""
    await enroll(world, "alice")
    world.store.delete_token("alice", "revoked", world.clock.now())
    world.sim.clear_requests()
    result = await world.lifecycle().drop("alice")
    assert result.upstream == "skipped"
    assert world.sim.requests() == []
    row = world.store.get_user("alice")
    assert row is not None
    assert row.state == "dropped"


async def test_unknown_user_is_a_usage_error(world: World) -> None:
    """Dropping or forgetting a user that was never enrolled: UnknownUserError (exit 2)."""
    for action in (world.lifecycle().drop, world.lifecycle().forget):
        with pytest.raises(UnknownUserError) as info:
            await action("nobody")
        assert info.value.exit_code == EX_USAGE


async def test_forget_leaves_no_result_of_the_user(world: World) -> None:
    """forget drops the user and purges every snapshot and history row of theirs, only theirs."""
    await enroll(world, "alice")
    await enroll(world, "bob")
    store_results(world, "alice")
    store_results(world, "bob")
    assert list(world.store.export_results("alice"))
    result = await world.lifecycle().forget("alice")
    assert result.upstream == "ok"
    assert result.purged is not None
    assert result.purged >= 3
    assert list(world.store.export_results("alice")) == []
    assert world.store.history("alice", "stats") == []
    assert world.store.history("alice", "latest-change") == []
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token) == ("dropped", None)
    assert len(list(world.store.export_results("bob"))) == 2
    assert world.store.history("bob", "stats")
