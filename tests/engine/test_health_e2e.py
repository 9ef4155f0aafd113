"""Health end to end (the adaptive schedule on virtual time): the real worker's passes in an
outage and the verdict `status --check` and `/healthz` give; no single user stops `serve`'s pass
job (`Service._pass_job`), and a wrong client secret trips the breaker while `serve` stays up."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

from lta_worker.report import collect_status
from lta_worker.simulator import DEMO_CLIENT_SECRET
from lta_worker.worker._scheduler import Notifier
from lta_worker.worker._serve import BREAKER_RETRY, Service
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = pytest.mark.anyio

INTERVAL = timedelta(minutes=10)
TICK = timedelta(seconds=30)  # how often `serve` would start a pass
SERVE_TICK = timedelta(minutes=1)  # `poll.tick` of the adaptive and `serve` tests


def verdict(harness: Harness) -> dict[str, Any]:
    return collect_status(harness.settings(), harness.clock.now())


async def test_an_outage_turns_health_unhealthy_within_the_interval_and_back(
    harness: Harness,
) -> None:
    """Down: unhealthy within `poll.interval`, through empty passes; healthy once reads return."""
    harness.configure("poll", interval="10m")
    for n in range(6):
        await harness.enroll(f"user-{n}")
    await harness.run_pass()
    assert verdict(harness)["healthy"] is True

    harness.advance(INTERVAL / 2)
    harness.sim.inject_fault("drop", rate=1.0)  # the service is gone: every read fails
    down_at = harness.clock.now()
    unhealthy_at = None
    empty_passes_after = 0
    while harness.clock.now() - down_at < 3 * INTERVAL:
        harness.advance(TICK)
        result = await harness.run_pass()
        assert result.counts["ok"] == 0
        data = verdict(harness)
        if unhealthy_at is None and not data["healthy"]:
            unhealthy_at = harness.clock.now()
        elif unhealthy_at is not None:
            assert data["healthy"] is False, data["problems"]  # and it stays so
            empty_passes_after += result.reads == 0
    assert unhealthy_at is not None, "healthy through the whole outage"
    assert unhealthy_at - down_at <= INTERVAL + TICK
    assert empty_passes_after > 0  # passes with nobody due did not make it healthy
    problems = verdict(harness)["problems"]
    assert any("failed" in p for p in problems), problems

    harness.sim.clear_faults()
    back_at = harness.clock.now()
    while not verdict(harness)["healthy"]:
        assert harness.clock.now() - back_at <= INTERVAL + TICK, verdict(harness)["problems"]
        harness.advance(TICK)
        await harness.run_pass()
    assert verdict(harness)["last_success"]["counts"]["ok"] > 0


async def _serve(h: Harness, tick: timedelta = SERVE_TICK) -> None:
    """Passes every `tick`, as `serve` starts them, until cancelled."""
    while True:
        await h.run_pass()
        await anyio.sleep(tick.total_seconds())


async def _until_unhealthy(h: Harness, limit: timedelta) -> timedelta:
    """How long until the verdict says unhealthy (checked every 10 s, passes running)."""
    start = h.clock.now()
    while h.clock.now() - start < limit:
        if not collect_status(h.settings(), h.clock.now())["healthy"]:
            break
        await anyio.sleep(10)
    return h.clock.now() - start


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("users", "busy", "budget", "max_interval"),
    [(3, 0, 1_000_000, "24h"), (6, 2, 24, "24h")],  # a generous budget; a tight one
)
async def test_an_outage_under_the_adaptive_schedule_shows_within_the_documented_bound(
    virtual_harness: Harness, users: int, busy: int, budget: int, max_interval: str
) -> None:
    """An outage shows within 2 x interval + tick + 1 s (docs/operations.md, "How soon...")."""
    h = virtual_harness
    h.configure("poll", schedule="adaptive", interval="10m", max_interval=max_interval)
    h.configure("poll", stats="on_change", tick="1m")
    h.sim.configure(budget=budget, window=3600, header_format="draft")
    async with autojump():
        for n in range(users):
            await h.enroll(f"user-{n}")
            h.sim.set_payload(f"user-{n}", "latest-change", {"changed_at": "2025-01-01T00:00Z"})
        for step in range(6 * 60 // 7):  # 6 h: only the busy users change
            for n in range(busy):
                h.sim.set_payload(f"user-{n}", "latest-change", {"changed_at": f"{step}"})
            await h.run_pass()
            await anyio.sleep(7 * 60)
        before = collect_status(h.settings(), h.clock.now())
        assert before["healthy"] is True, before["problems"]
        if busy:  # a user that changes is read sooner than an idle one, none past max_interval
            rows = [h.user(f"user-{n}") for n in (0, users - 1)]
            gaps = [r.next_due_at - r.last_polled_at for r in rows]
            assert rows[0].estimate.per_day() > rows[1].estimate.per_day()
            assert gaps[0] < gaps[1] <= timedelta(hours=24), gaps
        h.sim.inject_fault("503", rate=1.0)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_serve, h)
            took = await _until_unhealthy(h, timedelta(hours=30))
            tasks.cancel_scope.cancel()
    bound = 2 * INTERVAL + SERVE_TICK + timedelta(seconds=1)
    assert took <= bound, f"unhealthy {took} after the outage"


async def _forget_upstream(h: Harness, user: str) -> None:
    """Rotate the user's token elsewhere: its stored token now reads a plain 401."""
    old = h.user(user)
    await h.enroll(user, create=False)
    with h.store() as store:
        assert old.token is not None
        store.store_token(user, old.token, old.scopes, h.clock.now(), h.clock.now())


async def _serve_for(svc: Service, span: timedelta) -> list[Any]:
    """`serve`'s pass job every tick for `span` of virtual time; the passes' results."""
    results: list[Any] = []
    run_pass = svc.worker.run_pass

    async def recorded(**kwargs: Any) -> Any:
        results.append(await run_pass(**kwargs))
        return results[-1]

    svc.worker.run_pass = recorded  # type: ignore[method-assign]
    for _ in range(int(span / SERVE_TICK)):
        await svc._pass_job()
        assert not svc._fatal.is_set() and svc.exit_code == 0
        await anyio.sleep(SERVE_TICK.total_seconds())
    svc.worker.run_pass = run_pass  # type: ignore[method-assign]
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cause", ["forgotten_token", "nothing_recorded"])
async def test_one_user_alone_in_every_pass_never_stops_serve(
    virtual_harness: Harness, cause: str
) -> None:
    """A forgotten token (plain 401) or a 404, alone in every pass, never stops `serve`."""
    h = virtual_harness
    h.configure("poll", schedule="fixed", stats="on_change", interval="10m", tick="1m")
    async with autojump():
        for name in ("ada", "bob", "cy"):
            await h.enroll(name)
        async with h.worker(kind="serve") as worker:
            await worker.run_pass()  # everybody read once; all due again in 10 minutes
        if cause == "forgotten_token":
            await _forget_upstream(h, "cy")
        else:
            h.sim.set_payload("cy", "latest-change", None)
            with h.store() as store:  # due now, alone
                store.store_token("cy", h.user("cy").token, h.user("cy").scopes,
                                  h.clock.now(), h.clock.now())  # fmt: skip
        async with h.worker(kind="serve") as worker:
            svc = Service(worker, Notifier({}))
            results = await _serve_for(svc, timedelta(hours=1))
    assert [r.stopped for r in results if r.stopped != "completed"] == []
    assert any(r.users == 1 and r.reads for r in results[:2])  # cy alone in its pass
    cy = h.user("cy")
    if cause == "forgotten_token":
        assert (cy.state, cy.token is not None) == ("rejected", True)
    else:
        assert cy.state == "active"
        with h.store() as store:
            latest = {r.endpoint: r.status for r in store.export_results("cy")}
            assert latest["latest-change"] == "none"
    for name in ("ada", "bob"):
        assert len(h.reads(name)) >= 5  # read every interval all along
        assert h.user(name).state == "active"


@pytest.mark.timeout(120)
async def test_serve_with_a_wrong_secret_stays_up_unhealthy_and_recovers_on_reload(
    virtual_harness: Harness,
) -> None:
    """A wrong secret: `serve` stays up, unhealthy, retries slowly, recovers on reload."""
    h = virtual_harness
    h.configure("poll", tick="1m")
    async with autojump():
        await h.enroll("ada")
        h.secret_file.write_text("not-the-right-secret\n")
        async with h.worker(kind="serve") as worker:
            svc = Service(worker, Notifier({}))
            span = 2 * BREAKER_RETRY
            tripped = await _serve_for(svc, span)
            assert [r.stopped for r in tripped] == ["breaker"] * int(span / BREAKER_RETRY)
            assert svc.breaker == "plain_401"
            status = collect_status(h.settings(), h.clock.now(), store=worker.store)
            assert status["healthy"] is False
            assert any("client.secret_file" in p for p in status["problems"])
            assert h.user("ada").state == "active"
            h.secret_file.write_text(DEMO_CLIENT_SECRET + "\n")
            worker.reload(h.settings())
            (fixed, *_) = await _serve_for(svc, 2 * SERVE_TICK)
            assert (fixed.stopped, fixed.counts["ok"]) == ("completed", 2)
            assert svc.breaker is None
            status = collect_status(h.settings(), h.clock.now(), store=worker.store)
            assert (status["healthy"], status["problems"]) == (True, [])
