"""Spec section 7, one test per row of the error table, in every error-body style."""

from __future__ import annotations

import httpx
import pytest

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    ERROR_STYLES,
    LATEST_CHANGE_SCOPE,
    PLAIN_CLIENT_ID,
    STATS_SCOPE,
    Simulator,
)

from .helpers import LATEST, REDIRECT, STATS, Flow, bearer, code_of

pytestmark = pytest.mark.anyio


@pytest.fixture(params=ERROR_STYLES)
def style(request: pytest.FixtureRequest, sim: Simulator) -> str:
    """Each error-body style in turn, set on the simulator."""
    sim.configure(error_style=request.param)
    return str(request.param)


def _malformed_variants(credential: str) -> dict[str, str]:
    token, secret = credential.split(".", 1)
    return {
        "unknown-token": f"dspa_doesnotexist.{secret}",
        "wrong-secret": f"{token}.wrong-secret",
        "missing-secret": token,
        "empty-secret": f"{token}.",
        "missing-token": f"dspa_.{secret}",
        "secret-alone": secret,
        "token-with-extra-dot": f"{token}.{secret}.extra",
    }


async def test_401_plain_same_answer_for_unknown_malformed_or_wrong_secret(
    flow: Flow, style: str
) -> None:
    """Unknown, malformed and wrong-secret credentials all get one identical codeless 401."""
    credential = await flow.enrolled()
    answers: dict[str, httpx.Response] = {}
    for name, variant in _malformed_variants(credential).items():
        answers[name] = await flow.http.get(STATS, headers=bearer(variant))
    for name, response in answers.items():
        assert response.status_code == 401, name
        assert code_of(response, style) is None, name
    bodies = {r.content for r in answers.values()}
    challenges = {r.headers.get("www-authenticate") for r in answers.values()}
    assert len(bodies) == 1
    assert challenges == {'Bearer realm="api"'}


async def test_401_revoked_only_when_both_halves_are_correct(flow: Flow, style: str) -> None:
    """A revoked token gives PermanentAccessRevoked with its secret, a plain 401 without."""
    credential = await flow.enrolled()
    flow.sim.revoke("alice")
    token = credential.split(".", 1)[0]
    right = await flow.http.get(STATS, headers=bearer(credential))
    wrong = await flow.http.get(STATS, headers=bearer(f"{token}.wrong-secret"))
    assert (right.status_code, code_of(right, style)) == (401, "PermanentAccessRevoked")
    assert (wrong.status_code, code_of(wrong, style)) == (401, None)


async def test_401_no_cloud_sync_linked_until_the_user_links_it(flow: Flow, style: str) -> None:
    """A user without cloud sync gets 401 NoCloudSyncLinked on both reads; linking ends it."""
    credential = await flow.enrolled(linked=False)
    for path in (LATEST, STATS):
        response = await flow.http.get(path, headers=bearer(credential))
        assert (response.status_code, code_of(response, style)) == (401, "NoCloudSyncLinked")
    flow.sim.set_sync("alice", linked=True, last_sync_age_days=0)
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


@pytest.mark.parametrize("age_days", [95, None], ids=["95-days", "never-synced"])
async def test_403_cloud_sync_inactive(flow: Flow, style: str, age_days: int | None) -> None:
    """Cloud sync silent for over 90 days, or never synced, gives 403 CloudSyncInactive."""
    credential = await flow.enrolled(last_sync_age_days=age_days)
    response = await flow.http.get(LATEST, headers=bearer(credential))
    assert (response.status_code, code_of(response, style)) == (403, "CloudSyncInactive")


async def test_403_plain_when_the_user_did_not_grant_the_scope(flow: Flow, style: str) -> None:
    """A read needing a scope the user did not grant gets a codeless 403; the other reads."""
    credential = await flow.enrolled("alice", [LATEST_CHANGE_SCOPE])
    denied = await flow.http.get(STATS, headers=bearer(credential))
    allowed = await flow.http.get(LATEST, headers=bearer(credential))
    assert (denied.status_code, code_of(denied, style)) == (403, None)
    assert allowed.status_code == 200


async def test_403_plain_when_the_client_unticked_the_scope(flow: Flow, style: str) -> None:
    """A scope the client owner unticked gives a codeless 403 even though the user granted it."""
    credential = await flow.enrolled()
    flow.sim.set_client_scopes(DEMO_CLIENT_ID, [LATEST_CHANGE_SCOPE])
    denied = await flow.http.get(STATS, headers=bearer(credential))
    assert (denied.status_code, code_of(denied, style)) == (403, None)
    assert (await flow.http.get(LATEST, headers=bearer(credential))).status_code == 200
    flow.sim.set_client_scopes(DEMO_CLIENT_ID, [LATEST_CHANGE_SCOPE, STATS_SCOPE])
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


async def test_404_when_nothing_is_recorded_and_access_stays_valid(flow: Flow, style: str) -> None:
    """latest-change with nothing recorded gives a codeless 404; the same token still reads."""
    credential = await flow.enrolled()
    flow.sim.set_payload("alice", "latest-change", None)
    missing = await flow.http.get(LATEST, headers=bearer(credential))
    assert (missing.status_code, code_of(missing, style)) == (404, None)
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200
    flow.sim.set_payload("alice", "latest-change", {"id": "chg_1"})
    assert (await flow.http.get(LATEST, headers=bearer(credential))).json() == {"id": "chg_1"}


async def test_invalid_scope_for_a_client_without_the_mode(flow: Flow) -> None:
    """A long term scope asked by a client without the mode is refused with invalid_scope."""
    flow.sim.queue_consent("alice")
    response = await flow.authorize([STATS_SCOPE], client_id=PLAIN_CLIENT_ID, state="s-1")
    assert response.status_code == 302
    location = httpx.URL(response.headers["location"])
    assert str(location).startswith(REDIRECT)
    assert location.params["error"] == "invalid_scope"
    assert location.params["state"] == "s-1"
    assert "code" not in location.params


@pytest.mark.parametrize("style_name", ERROR_STYLES)
async def test_codeless_answers_carry_no_word_that_passes_for_a_code(
    flow: Flow, sim: Simulator, style_name: str
) -> None:
    """Plain 401/403/404 bodies hold only a message, never an error or code field."""
    sim.configure(error_style=style_name)
    credential = await flow.enrolled()
    sim.set_payload("alice", "latest-change", None)
    unknown = await flow.http.get(STATS, headers=bearer("dspa_x.y"))
    missing = await flow.http.get(LATEST, headers=bearer(credential))
    for response in (unknown, missing):
        if response.content:
            body = response.json()
            assert "error" not in body
            assert "code" not in body
            assert body.get("type", "about:blank") == "about:blank"


@pytest.mark.parametrize(
    ("age_seconds", "status"),
    [(89 * 86400, 200), (90 * 86400, 200), (90 * 86400 + 1, 403), (200 * 86400, 403)],
    ids=["89-days", "exactly-90-days", "90-days-and-1s", "200-days"],
)
async def test_90_day_boundary(flow: Flow, age_seconds: int, status: int) -> None:
    """Exactly 90 days of silence still reads; anything more is CloudSyncInactive."""
    credential = await flow.enrolled(last_sync_age_days=0)
    flow.sim.advance(age_seconds)
    response = await flow.http.get(STATS, headers=bearer(credential))
    assert response.status_code == status
