"""No single user stops `serve`: its pass job (`Service._pass_job`) over the real worker and
the simulator on virtual time; a wrong client secret trips the breaker and `serve` recovers."""

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

TICK = timedelta(minutes=1)


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
    for _ in range(int(span / TICK)):
        await svc._pass_job()
        assert not svc._fatal.is_set() and svc.exit_code == 0
        await anyio.sleep(TICK.total_seconds())
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
            (fixed, *_) = await _serve_for(svc, 2 * TICK)
            assert (fixed.stopped, fixed.counts["ok"]) == ("completed", 2)
            assert svc.breaker is None
            status = collect_status(h.settings(), h.clock.now(), store=worker.store)
            assert (status["healthy"], status["problems"]) == (True, [])
