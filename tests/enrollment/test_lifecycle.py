"""Drop and forget through the in-process simulator: upstream DELETE, local deletion, purge."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from lta_worker.enrollment import DropResult, Lifecycle
from lta_worker.errors import EX_USAGE, UnknownUserError
from lta_worker.pacing import Permit
from lta_worker.secret import Secret
from lta_worker.simulator import SimulatorTransport
from lta_worker.upstream import ApiClient, http_client
from support.storage import read_turn

from .conftest import World

pytestmark = pytest.mark.anyio


def store_results(world: World, user: str) -> None:
    """Write two snapshots and a history row for `user`, as a pass would."""
    row = world.store.get_user(user)
    assert row is not None
    for minutes, value in ((0, 1), (60, 2)):
        now = world.clock.now() + timedelta(minutes=minutes)
        world.store.apply([read_turn(row.id, now, stats={"count": value}, latest_change=None)])


async def test_token_deleted_for_a_drop_or_forget_asked_for_is_info(world: World) -> None:
    """`token.deleted` of an operator's drop or forget is info (a revocation's stays a warning)."""
    await world.enroll("alice")
    await world.enroll("bob")
    with capture_logs() as logs:
        await world.lifecycle().drop("alice")
        await world.lifecycle().forget("bob")
    deleted = [(e["user"], e["log_level"]) for e in logs if e["event"] == "token.deleted"]
    assert deleted == [("alice", "info"), ("bob", "info")]


async def through(
    world: World, transport: httpx.AsyncBaseTransport, *users: str, forget: bool = False
) -> DropResult:
    """Drop (or forget) each user with the service behind `transport`; the last result."""
    async with http_client(world.settings.service, transport=transport) as http:
        api = ApiClient(http, world.settings.service, world.settings.client, world.client_secret)
        lifecycle = world.lifecycle(api)
        for user in users:
            result = await (lifecycle.forget if forget else lifecycle.drop)(user)
    return result


async def test_drop_pending_when_upstream_unreachable(world: World) -> None:
    """An unreachable service: the user stays `dropping`, token kept for the retry, never read."""
    await world.enroll("alice")
    inner = SimulatorTransport(world.sim)

    async def failing_delete(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            raise httpx.ConnectError("connection refused")
        return await inner.handle_async_request(request)

    result = await through(world, httpx.MockTransport(failing_delete), "alice")
    assert (result.upstream, result.state) == ("failed", "dropping")
    assert result.error is not None
    assert "connect" in result.error
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token is not None) == ("dropping", True)
    assert result.retry_at is not None and row.next_due_at == result.retry_at
    assert world.store.count_due(result.retry_at + timedelta(days=1)) == 0


@pytest.mark.parametrize("before", ["dropped", "revoked"])
async def test_drop_without_a_token_skips_upstream(world: World, before: str) -> None:
    """A dropped or revoked user is left as it is (stamps kept), with no DELETE sent."""
    await world.enroll("alice")
    if before == "dropped":
        await world.lifecycle().drop("alice")
    else:
        world.store.delete_token("alice", "revoked", world.clock.now())
    world.clock.advance(3600)
    world.sim.clear_requests()
    result = await world.lifecycle().drop("alice")
    assert (result.upstream, result.status, result.state, result.previous_state) == (
        "skipped", None, before, before,
    )  # fmt: skip
    assert world.sim.requests() == []
    assert world.store.get_user("alice").state == before  # type: ignore[union-attr]
    with world.store.database.read() as conn:
        revoked_at, dropped_at = conn.execute(
            text("SELECT revoked_at, dropped_at FROM users")
        ).one()
    assert (revoked_at is not None, dropped_at is not None) == (
        before == "revoked", before == "dropped",
    )  # fmt: skip


async def test_unknown_user_is_a_usage_error(world: World) -> None:
    """Dropping or forgetting a user that was never enrolled: UnknownUserError (exit 2)."""
    for action in (world.lifecycle().drop, world.lifecycle().forget):
        with pytest.raises(UnknownUserError) as info:
            await action("nobody")
        assert info.value.exit_code == EX_USAGE


class FreePermits:
    """A pacer that grants every permit at once and keeps the statuses it is fed."""

    def __init__(self) -> None:
        self.fed: list[int | None] = []

    async def acquire(self) -> Permit:
        return Permit(sent_at=0.0)

    def feed(self, permit: Permit | None, headers: object, status: int | None, **_: object) -> None:
        assert permit is not None  # every DELETE goes with the permit it was granted
        self.fed.append(status)

    def snapshot(self) -> None:
        return None


def answering(status: int, body: bytes = b"") -> httpx.MockTransport:
    """A service that answers every request with `status` (and `body`)."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body)

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("answer", [None, 503], ids=["confirmed", "delete-fails"])
async def test_forget_purges_every_result_of_the_user_at_once(
    world: World, answer: int | None
) -> None:
    """forget purges the user's snapshots and history (only theirs) whatever the DELETE says."""
    await world.enroll("alice")
    await world.enroll("bob")
    store_results(world, "alice")
    store_results(world, "bob")
    assert list(world.store.export_results("alice"))
    if answer is None:
        result = await world.lifecycle().forget("alice")
    else:
        result = await through(world, answering(answer), "alice", forget=True)
    expected = ("ok", "dropped") if answer is None else ("failed", "dropping")
    assert (result.upstream, result.state) == expected
    assert result.purged is not None
    assert result.purged >= 3
    assert list(world.store.export_results("alice")) == []
    assert world.store.history("alice", "stats") == []
    assert world.store.history("alice", "latest-change") == []
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token is None) == (expected[1], answer is None)
    assert len(list(world.store.export_results("bob"))) == 2
    assert world.store.history("bob", "stats")


async def test_a_pending_drop_is_retried_until_confirmed(world: World) -> None:
    """A pending drop is sent again by `retry_pending` once due; the 204 drops the token."""
    await world.enroll("alice")
    token = world.token_of("alice")
    first = await through(world, answering(503), "alice")
    assert first.retry_at is not None
    pacer = FreePermits()
    early = await world.lifecycle().retry_pending(pacer, owner="i1", lease=timedelta(minutes=5))
    assert (early.confirmed, early.pending) == (0, 0)  # not due yet
    world.clock.advance((first.retry_at - world.clock.now()).total_seconds() + 1)
    done = await world.lifecycle().retry_pending(pacer, owner="i1", lease=timedelta(minutes=5))
    assert (done.confirmed, done.pending, pacer.fed) == (1, 0, [200, 204])  # read, DELETE
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token) == ("dropped", None)
    after = await world.api.read("stats", token)
    assert after.status == 401


@pytest.mark.parametrize(
    ("status", "body", "upstream", "state"),
    [
        pytest.param(204, b"", "ok", "dropped", id="204-confirmed"),
        pytest.param(200, b"", "ok", "dropped", id="other-2xx-confirmed"),
        pytest.param(
            401, b'{"error":"PermanentAccessRevoked"}', "ok", "dropped", id="401-revoked-confirmed"
        ),
        pytest.param(401, b"", "refused", "dropping", id="401-plain-refused"),
        pytest.param(404, b"", "failed", "dropping", id="404-retried"),
        pytest.param(500, b"", "failed", "dropping", id="500-retried"),
        pytest.param(503, b"", "failed", "dropping", id="503-retried"),
    ],
)
async def test_what_the_delete_answer_means(
    world: World, status: int, body: bytes, upstream: str, state: str
) -> None:
    """Each answer to the DELETE either confirms the drop or keeps it (and the token) pending."""
    await world.enroll("alice")
    result = await through(world, answering(status, body), "alice")
    assert (result.upstream, result.state, result.status) == (upstream, state, status)
    assert result.previous_state == "active"
    row = world.store.get_user("alice")
    assert row is not None
    assert (row.state, row.token is None) == (state, state == "dropped")


async def test_dropping_a_dropping_user_sends_the_delete_again(world: World) -> None:
    """A second `drop` of a pending drop retries the DELETE at once."""
    await world.enroll("alice")
    await through(world, answering(503), "alice")
    world.sim.clear_requests()
    result = await world.lifecycle().drop("alice")
    assert (result.upstream, result.previous_state, result.state) == ("ok", "dropping", "dropped")
    assert [r.method for r in world.sim.requests()] == ["GET", "DELETE"]


async def test_an_undecryptable_pending_drop_is_kept_and_retried_later(world: World) -> None:
    """A tampered token of a pending drop stops neither the retries nor the others."""
    await world.enroll("alice")
    await world.enroll("bob")
    await through(world, answering(503), "alice", "bob")
    with world.store.database.write() as conn:
        conn.execute(
            text("UPDATE users SET token_ciphertext = :junk WHERE user = 'alice'"),
            {"junk": b"\x00" * 60},
        )

    world.clock.advance(3 * 3600)
    done = await world.lifecycle().retry_pending(
        FreePermits(), owner="i1", lease=timedelta(minutes=5)
    )
    assert (done.confirmed, done.pending) == (1, 1)
    alice, bob = world.store.get_user("alice"), world.store.get_user("bob")
    assert alice is not None and bob is not None
    assert (alice.state, alice.last_outcome) == ("dropping", "undecryptable")
    assert alice.next_due_at == world.clock.now() + world.settings.poll.parked_interval
    assert (bob.state, bob.token) == ("dropped", None)


def with_secret(world: World, secret: str) -> Lifecycle:
    """The world's Lifecycle, but sending `secret` as the client secret."""
    return world.lifecycle(
        ApiClient(world.http, world.settings.service, world.settings.client, Secret(secret))
    )


async def test_a_wrong_client_secret_keeps_the_token_instead_of_trusting_a_204(
    world: World,
) -> None:
    """A wrong client secret: the read's plain 401 stops the DELETE; the token waits for a retry."""
    await world.enroll("alice")
    token = world.token_of("alice")
    world.sim.clear_requests()
    refused = await with_secret(world, "not-the-client-secret").drop("alice")
    assert (refused.upstream, refused.state) == ("refused", "dropping")
    assert refused.error is not None and "client secret" in refused.error
    assert [r.method for r in world.sim.requests()] == ["GET"]
    row = world.store.get_user("alice")
    assert row is not None and row.token is not None
    alive = await world.api.read("stats", token)
    assert alive.status == 200  # the grant is still live upstream
    assert refused.retry_at is not None
    world.clock.advance((refused.retry_at - world.clock.now()).total_seconds() + 1)
    done = await world.lifecycle().retry_pending(
        FreePermits(), owner="i1", lease=timedelta(minutes=5)
    )
    assert (done.confirmed, done.pending) == (1, 0)
    gone = await world.api.read("stats", token)
    assert gone.status == 401


async def test_a_delete_that_got_no_answer_is_confirmed_by_the_next_read(world: World) -> None:
    """A DELETE whose answer was lost is confirmed by the retry's read getting a 401."""
    await world.enroll("alice")
    inner = SimulatorTransport(world.sim)

    async def answer_lost(request: httpx.Request) -> httpx.Response:
        response = await inner.handle_async_request(request)
        if request.method == "DELETE":  # done upstream, the answer never arrives
            raise httpx.ReadError("connection reset")
        return response

    first = await through(world, httpx.MockTransport(answer_lost), "alice")
    assert (first.upstream, first.state) == ("failed", "dropping")
    world.sim.clear_requests()
    again = await world.lifecycle().drop("alice")
    assert (again.upstream, again.state) == ("ok", "dropped")
    sent = [r.method for r in world.sim.requests()]
    assert sent == ["GET"], sent  # the read's plain 401 confirmed it: no DELETE again


async def test_a_user_rejected_alone_is_dropped_on_the_reads_401(world: World) -> None:
    """A user already rejected alone is dropped on the read's plain 401 (no wrong secret)."""
    await world.enroll("alice")
    row = world.store.get_user("alice")
    assert row is not None
    turn = read_turn(row.id, world.clock.now(), state="rejected")
    world.store.apply([replace(turn, consecutive_failures=1, last_outcome="rejected")])
    result = await through(world, answering(401), "alice")
    assert (result.upstream, result.state) == ("ok", "dropped")
