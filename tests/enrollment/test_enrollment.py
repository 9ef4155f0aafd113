"""Enrollment end to end through the in-process simulator: consent, PKCE, exchange, token."""

from __future__ import annotations

import httpx
import pytest

from lta_worker.config import LONG_TERM_SCOPES
from lta_worker.domain import classify
from lta_worker.enrollment import challenge_s256, parse_redirect
from lta_worker.enrollment._enroll import PENDING_TTL
from lta_worker.errors import (
    EX_CONFIG,
    EX_USAGE,
    EnrollmentError,
    ModeNotOpenedError,
    StorageError,
    UsageError,
)
from lta_worker.secret import Secret
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET
from lta_worker.storage import Store
from lta_worker.upstream import ApiClient
from support.enroll import basic, query_of

from .conftest import AUTH_URL, REDIRECT_URI, World

pytestmark = pytest.mark.anyio


async def test_consent_url_carries_the_flow_parameters(world: World) -> None:
    """The consent URL asks {auth_url}/oidc/auth for a code with openid + both scopes and S256."""
    url = world.enrollment().start("alice")
    assert url.startswith(f"{AUTH_URL}/oidc/auth?")
    params = query_of(url)
    assert params["client_id"] == DEMO_CLIENT_ID
    assert params["redirect_uri"] == REDIRECT_URI
    assert params["response_type"] == "code"
    assert params["scope"] == " ".join(("openid", *LONG_TERM_SCOPES))
    assert params["code_challenge_method"] == "S256"
    assert len(params["code_challenge"]) == 43
    assert len(params["state"]) >= 43
    assert "code_verifier" not in params


async def test_consent_to_stored_token(world: World) -> None:
    """Consent -> code -> exchange -> long term token -> stored encrypted, active, due now."""
    enrollment = world.enrollment()
    location = await world.consent(enrollment.start("alice"), "svc-alice")
    result = await enrollment.finish("alice", location)
    assert result.user == "alice"
    assert result.scopes == LONG_TERM_SCOPES
    assert result.rotated is False
    row = world.store.get_user("alice")
    assert row is not None
    assert row.state == "active"
    assert row.scopes == LONG_TERM_SCOPES
    assert row.next_due_at == world.clock.now()
    assert row.token is not None
    token = world.token_of("alice")
    assert token.reveal().startswith("dspa_")
    assert token.reveal().encode() not in row.token.ciphertext
    answer = await world.api.read("stats", token)
    assert answer.status == 200


@pytest.mark.parametrize("form", ["other_state", "bare_code"])
async def test_a_code_with_another_consents_verifier_fails_pkce(world: World, form: str) -> None:
    """A code finished under another consent's verifier fails PKCE (invalid_grant): no user."""
    enrollment = world.enrollment()
    first = enrollment.start("alice")
    second = enrollment.start("bob" if form == "bare_code" else "alice")
    code = query_of(await world.consent(first, "svc-alice"))["code"]
    user, given = "bob", code
    if form == "other_state":
        user, given = "alice", f"{REDIRECT_URI}?code={code}&state={query_of(second)['state']}"
    with pytest.raises(EnrollmentError) as info:
        await enrollment.finish(user, given)
    assert info.value.code == "invalid_grant"
    assert world.store.get_user("alice") is None and world.store.get_user("bob") is None
    token_calls = [r for r in world.sim.requests() if r.path.endswith("/oidc/token")]
    assert [r.code for r in token_calls] == ["invalid_grant"]


async def test_enrolling_again_rotates_the_token(world: World) -> None:
    """Enrolling again stores a new token; the old one gets a plain 401, the new one reads."""
    await world.enroll("alice")
    old = world.token_of("alice")
    world.clock.advance(3600)
    assert (await world.enroll("alice")).rotated is True
    new = world.token_of("alice")
    assert new != old
    stale = await world.api.read("stats", old)
    assert stale.status == 401
    outcome = classify("stats", stale)
    assert outcome.kind == "rejected"
    assert outcome.code is None
    fresh = await world.api.read("stats", new)
    assert fresh.status == 200
    row = world.store.get_user("alice")
    assert row is not None
    assert row.state == "active"
    assert row.next_due_at == world.clock.now()


async def test_client_without_the_mode_gets_invalid_scope(plain_world: World) -> None:
    """A client without the mode: the consent answers invalid_scope -> ModeNotOpenedError (78)."""
    enrollment = plain_world.enrollment()
    location = await plain_world.consent(enrollment.start("alice"), "svc-alice")
    assert query_of(location)["error"] == "invalid_scope"
    with pytest.raises(ModeNotOpenedError) as info:
        await enrollment.finish("alice", location)
    assert info.value.exit_code == EX_CONFIG
    text = str(info.value)
    assert "invalid_scope" in text
    assert "not opened on this client" in text
    assert "operator" in text
    assert plain_world.store.get_user("alice") is None


async def test_denied_consent_is_an_enrollment_error(world: World) -> None:
    """A user who declines: EnrollmentError(access_denied), nothing stored."""
    enrollment = world.enrollment()
    url = enrollment.start("alice")
    world.sim.queue_consent("svc-alice", deny=True)
    location = (await world.http.get(url)).headers["location"]
    with pytest.raises(EnrollmentError) as info:
        await enrollment.finish("alice", location)
    assert info.value.code == "access_denied"
    assert world.store.get_user("alice") is None


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("used", "already used"),
        ("expired", "expired"),
        ("other_user", "another user"),
        ("unknown", "unknown"),
        ("bare_unstarted", "no consent was started"),
    ],
)
async def test_a_redirect_of_no_live_consent_is_refused(
    world: World, case: str, words: str
) -> None:
    """A used, expired, foreign or unknown consent is a UsageError (2); no code is exchanged."""
    enrollment = world.enrollment()
    location = await world.consent(enrollment.start("alice"), "svc-alice")
    user, given = "alice", location
    if case == "used":
        await enrollment.finish("alice", location)
    elif case == "expired":
        world.clock.advance(PENDING_TTL.total_seconds() + 1)
    elif case == "other_user":
        user = "bob"
    elif case == "unknown":
        given = f"{REDIRECT_URI}?code=abcdef&state=forged"
    else:
        user, given = "bob", "some-code-value"
    world.sim.clear_requests()
    with pytest.raises(UsageError, match=words) as info:
        await enrollment.finish(user, given)
    assert info.value.exit_code == EX_USAGE
    assert world.sim.requests() == []
    assert world.store.get_user("bob") is None
    if case == "other_user":  # and the consent is void afterwards
        with pytest.raises(UsageError):
            await enrollment.finish("alice", location)


@pytest.mark.parametrize("with_state", [False, True])
async def test_a_bare_code_finishes_the_newest_consent(world: World, with_state: bool) -> None:
    """A bare code finishes the user's newest consent, or the one whose state comes with it."""
    enrollment = world.enrollment()
    params = query_of(await world.consent(enrollment.start("alice"), "svc-alice"))
    state = params["state"] if with_state else None
    result = await enrollment.finish("alice", params["code"], state=state)
    assert result.scopes == LONG_TERM_SCOPES
    assert world.store.get_user("alice") is not None


@pytest.mark.parametrize(
    "text", ["", "   ", f"{REDIRECT_URI}?state=abc", f"{REDIRECT_URI}", "two words"]
)
def test_unusable_input_is_a_usage_error(text: str) -> None:
    """Empty input, a URL without code or error, or several words: UsageError."""
    with pytest.raises(UsageError):
        parse_redirect(text)


def test_parse_redirect_forms() -> None:
    """A whole URL, a query string and a bare code are all understood."""
    url = parse_redirect(f"{REDIRECT_URI}?code=c0de-123&state=st")
    assert (url.code, url.state) == (Secret("c0de-123"), "st")
    query = parse_redirect("?state=st&code=c0de-123")
    assert (query.code, query.state) == (Secret("c0de-123"), "st")
    bare = parse_redirect("  c0de-123=\n")
    assert (bare.code, bare.state) == (Secret("c0de-123="), None)
    error = parse_redirect(f"{REDIRECT_URI}?error=invalid_scope&state=st")
    assert (error.error, error.code) == ("invalid_scope", None)
    crafted = parse_redirect(f"{REDIRECT_URI}?error=%3Cscript%3E+dspa_x")
    assert crafted.error == "unrecognised_error"


@pytest.mark.parametrize("user", ["", " alice", "a\nb", "x" * 256])
async def test_bad_user_ids_are_refused(world: World, user: str) -> None:
    """User ids must be 1-255 printable characters without surrounding spaces."""
    with pytest.raises(UsageError):
        world.enrollment().start(user)


async def _user_access_token(world: World, sim_user: str) -> Secret:
    """A user access token from a long term consent, obtained the way any client would."""
    world.sim.queue_consent(sim_user)
    verifier = Secret("v" * 43)
    url = world.enrollment().consent_url("st" * 22, challenge_s256(verifier))
    code = query_of((await world.http.get(url)).headers["location"])["code"]
    response = await world.http.post(
        f"{AUTH_URL}/oidc/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT_URI,
            "code_verifier": verifier.reveal(),
        },
        headers={"Authorization": basic(DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)},
    )
    assert response.status_code == 200, response.text
    return Secret(response.json()["access_token"])


async def test_enroll_from_a_user_access_token(world: World) -> None:
    """A user access token from elsewhere creates and stores the long term token."""
    user_token = await _user_access_token(world, "svc-dave")
    result = await world.enrollment().from_user_token("dave", user_token)
    assert result.scopes == LONG_TERM_SCOPES
    assert world.token_of("dave").reveal().startswith("dspa_")


async def test_refused_user_access_token_stores_nothing(world: World) -> None:
    """An unknown user access token is EnrollmentError `token_refused`, with a hint; no user."""
    with pytest.raises(EnrollmentError) as info:
        await world.enrollment().from_user_token("erin", Secret("not-a-real-user-token"))
    assert info.value.reason == "token_refused" and info.value.hint
    assert world.store.get_user("erin") is None


async def test_create_token_invalid_scope_means_mode_not_opened(world: World) -> None:
    """If the operator withdrew the mode between consent and creation: ModeNotOpenedError."""
    user_token = await _user_access_token(world, "svc-fay")
    world.sim.withdraw_mode(DEMO_CLIENT_ID)
    with pytest.raises(ModeNotOpenedError):
        await world.enrollment().from_user_token("fay", user_token)


class FailingStore(Store):
    """A store whose token write fails, as a full disk or a lost database would."""

    def store_token(self, *args: object, **kwargs: object) -> bool:
        raise StorageError("the database refused the write")


async def test_token_that_cannot_be_stored_is_dropped_upstream(world: World) -> None:
    """When storing fails, the just-created token is dropped so no unknown live token remains."""
    failing = FailingStore(world.store.database)
    enrollment = world.enrollment(store=failing)
    location = await world.consent(enrollment.start("gus"), "svc-gus")
    with pytest.raises(StorageError):
        await enrollment.finish("gus", location)
    deletes = [r for r in world.sim.requests() if r.method == "DELETE"]
    assert [(d.client, d.user, d.status) for d in deletes] == [(DEMO_CLIENT_ID, "svc-gus", 204)]
    assert world.sim.client_info(DEMO_CLIENT_ID)["tokens"] == 0


async def test_network_failure_during_exchange_is_reported(world: World) -> None:
    """An unreachable token endpoint raises EnrollmentError naming the cause."""
    enrollment = world.enrollment()
    location = await world.consent(enrollment.start("hal"), "svc-hal")

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as http:
        api = ApiClient(http, world.settings.service, world.settings.client, world.client_secret)
        with pytest.raises(EnrollmentError, match="connect"):
            await world.enrollment(api=api).finish("hal", location)
