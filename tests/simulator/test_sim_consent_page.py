"""The simulator's consent page (`consent_page` on, nobody queued): Allow, Deny, used once."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import httpx
import pytest

from lta_worker.simulator import LATEST_CHANGE_SCOPE, LONG_TERM_SCOPES, STATS_SCOPE, Simulator

from .helpers import REDIRECT, Flow, pkce_pair

pytestmark = pytest.mark.anyio


async def _page(flow: Flow) -> tuple[httpx.Response, str]:
    flow.sim.configure(consent_page=True)
    page = await flow.authorize(challenge=pkce_pair()[1])
    found = re.search(r'name="request" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return page, found.group(1)


async def _decide(flow: Flow, request: str, decision: str, scopes: list[str]) -> httpx.Response:
    form = [("request", request), ("account", "svc-ann"), ("decision", decision)]
    form += [("scope", s) for s in scopes]
    return await flow.http.post(
        "/auth/oidc/consent",
        content=urlencode(form),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )


async def test_the_page_offers_every_requested_scope_ticked(flow: Flow) -> None:
    """The page names the client and offers each requested long term scope ticked."""
    page, _ = await _page(flow)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "demo-client" in page.text
    for scope in LONG_TERM_SCOPES:
        assert re.search(rf'value="{re.escape(scope)}" checked', page.text)
    assert 'id="allow"' in page.text and 'id="deny"' in page.text


@pytest.mark.parametrize(
    "ticked", [[LATEST_CHANGE_SCOPE], [STATS_SCOPE], list(LONG_TERM_SCOPES), []]
)
async def test_allow_grants_exactly_the_scopes_left_ticked(
    flow: Flow, sim: Simulator, ticked: list[str]
) -> None:
    """Allow redirects (303) with a code granting exactly the scopes left ticked."""
    _, request = await _page(flow)
    answer = await _decide(flow, request, "allow", ticked)
    assert answer.status_code == 303
    location = httpx.URL(answer.headers["location"])
    assert str(location).startswith(REDIRECT)
    assert location.params["state"] == "st4te"
    assert location.params["code"]
    (issued,) = sim.world.codes.values()
    assert issued.scopes == ("openid", *[s for s in LONG_TERM_SCOPES if s in ticked])


async def test_deny_answers_access_denied(flow: Flow) -> None:
    """Deny redirects to the callback with error=access_denied and the state, no code."""
    _, request = await _page(flow)
    answer = await _decide(flow, request, "deny", list(LONG_TERM_SCOPES))
    location = httpx.URL(answer.headers["location"])
    assert location.params["error"] == "access_denied"
    assert location.params["state"] == "st4te"
    assert "code" not in location.params


async def test_a_consent_request_is_answered_once(flow: Flow) -> None:
    """The page's request id works once; a second answer, or an unknown id, is a 400."""
    _, request = await _page(flow)
    assert (await _decide(flow, request, "allow", [])).status_code == 303
    assert (await _decide(flow, request, "allow", [])).status_code == 400
    assert (await _decide(flow, "made-up", "allow", [])).status_code == 400


async def test_a_queued_consent_still_wins_over_the_page(flow: Flow, sim: Simulator) -> None:
    """With the page on, a consent queued through the control API is used first."""
    sim.configure(consent_page=True)
    sim.queue_consent("svc-bob")
    answer = await flow.authorize()
    assert answer.status_code == 302
    assert "code=" in answer.headers["location"]
