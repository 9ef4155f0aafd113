"""Consent, code exchange with PKCE, enrollment refusals, and both authentication modes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    HISTORY_SCOPE,
    LONG_TERM_SCOPES,
    PLAIN_CLIENT_ID,
    PLAIN_CLIENT_SECRET,
    Simulator,
    default_clients,
)

from .helpers import LATEST, REDIRECT, STATS, TOKENS, Flow, bearer, pkce_pair

pytestmark = pytest.mark.anyio

PLAIN = (PLAIN_CLIENT_ID, PLAIN_CLIENT_SECRET)


def _params(**overrides: str) -> dict[str, str]:
    params = {
        "client_id": DEMO_CLIENT_ID,
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "scope": "openid " + " ".join(LONG_TERM_SCOPES),
        "state": "abc",
    }
    return {k: v for k, v in (params | overrides).items() if v}


# -- consent ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"client_id": "nobody"},
        {"client_id": ""},
        {"redirect_uri": "https://evil.example/cb"},
        {"redirect_uri": ""},
    ],
    ids=["unknown-client", "no-client", "unregistered-redirect", "no-redirect"],
)
async def test_consent_never_redirects_to_an_unverified_address(
    flow: Flow, overrides: dict[str, str]
) -> None:
    """An unknown client or unregistered redirect_uri gets a 400 page, not a redirect."""
    flow.sim.queue_consent("alice")
    response = await flow.http.get("/auth/oidc/auth", params=_params(**overrides))
    assert response.status_code == 400
    assert "location" not in response.headers


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"response_type": "token"}, "unsupported_response_type"),
        ({"scope": " ".join(LONG_TERM_SCOPES)}, "invalid_request"),
        ({"scope": "openid cloud-sync.permanent.everything"}, "invalid_scope"),
        ({"code_challenge": "x" * 43, "code_challenge_method": "plain"}, "invalid_request"),
        ({"code_challenge": "short", "code_challenge_method": "S256"}, "invalid_request"),
    ],
    ids=["response-type", "no-openid", "unknown-long-term-scope", "plain-pkce", "bad-challenge"],
)
async def test_consent_errors_redirect_with_error_and_state(
    flow: Flow, overrides: dict[str, str], error: str
) -> None:
    """Invalid consent parameters come back to the redirect address with error and state."""
    flow.sim.queue_consent("alice")
    response = await flow.http.get("/auth/oidc/auth", params=_params(**overrides))
    assert response.status_code == 302
    params = httpx.URL(response.headers["location"]).params
    assert (params["error"], params["state"]) == (error, "abc")


async def test_consent_without_a_queued_user_is_a_clear_400(flow: Flow) -> None:
    """With nobody queued to consent, the answer says how to queue one."""
    response = await flow.http.get("/auth/oidc/auth", params=_params())
    assert response.status_code == 400
    assert "/_sim/consent" in response.text


async def test_auto_consent_approves_for_login_hint(flow: Flow, sim: Simulator) -> None:
    """With auto-consent on and nobody queued, the login_hint user consents (and is created)."""
    sim.configure(auto_consent=True)
    response = await flow.http.get("/auth/oidc/auth", params=_params(login_hint="zoe"))
    assert response.status_code == 302
    assert "code" in httpx.URL(response.headers["location"]).params
    assert sim.user_info("zoe")["linked"] is True


async def test_plain_client_gets_regular_scopes(flow: Flow) -> None:
    """A client without the mode can still run an ordinary authorization."""
    flow.sim.add_user("alice")
    token = await flow.user_token("alice", [HISTORY_SCOPE], client=PLAIN)
    assert token


async def test_redirect_uri_added_through_control_is_accepted(flow: Flow, sim: Simulator) -> None:
    """A redirect address registered through the control API is accepted."""
    await flow.http.post(
        "/_sim/clients/demo-client/redirect-uris", json={"uri": "https://my.app/cb"}
    )
    sim.queue_consent("alice")
    response = await flow.http.get(
        "/auth/oidc/auth", params=_params(redirect_uri="https://my.app/cb")
    )
    assert response.headers["location"].startswith("https://my.app/cb?code=")


# -- the token endpoint -----------------------------------------------------------------------


async def test_pkce_correct_verifier_is_accepted(flow: Flow) -> None:
    """The code exchanges when the verifier matches the S256 challenge."""
    verifier, challenge = pkce_pair()
    code = await flow.code("alice", challenge=challenge)
    response = await flow.exchange(code, verifier=verifier)
    assert response.status_code == 200
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 3600
    assert body["scope"].split() == ["openid", *LONG_TERM_SCOPES]
    assert not body["access_token"].startswith("dspa_")
    assert response.headers["cache-control"] == "no-store"


async def test_client_secret_post_is_accepted(flow: Flow) -> None:
    """Client authentication by client_id and client_secret in the form works."""
    code = await flow.code("alice")
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT,
        "client_id": DEMO_CLIENT_ID,
        "client_secret": DEMO_CLIENT_SECRET,
    }
    response = await flow.http.post("/auth/oidc/token", data=data)
    assert response.status_code == 200


@pytest.mark.parametrize(
    "auth", [(DEMO_CLIENT_ID, "wrong"), ("nobody", "x"), None], ids=["wrong", "unknown", "none"]
)
async def test_bad_client_authentication_is_invalid_client(
    flow: Flow, auth: tuple[str, str] | None
) -> None:
    """A wrong, unknown or missing client authentication gets 401 invalid_client."""
    code = await flow.code("alice")
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
    response = await flow.http.post("/auth/oidc/token", data=data, auth=auth)
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"
    assert DEMO_CLIENT_SECRET not in response.text


async def _missing_verifier(flow: Flow) -> httpx.Response:
    return await flow.exchange(await flow.code("alice", challenge=pkce_pair()[1]))


async def _wrong_verifier(flow: Flow) -> httpx.Response:
    code = await flow.code("alice", challenge=pkce_pair()[1])
    return await flow.exchange(code, verifier="wrong-" * 10)


async def _verifier_without_challenge(flow: Flow) -> httpx.Response:  # no PKCE downgrade
    return await flow.exchange(await flow.code("alice"), verifier=pkce_pair()[0])


async def _used_twice(flow: Flow) -> httpx.Response:
    code = await flow.code("alice")
    assert (await flow.exchange(code)).status_code == 200
    return await flow.exchange(code)


async def _another_client(flow: Flow) -> httpx.Response:
    return await flow.exchange(await flow.code("alice"), client=PLAIN)


async def _another_redirect(flow: Flow) -> httpx.Response:
    return await flow.http.post(
        "/auth/oidc/token",
        data={"grant_type": "authorization_code", "code": await flow.code("alice")}
        | {"redirect_uri": "http://x/cb"},
        auth=(DEMO_CLIENT_ID, DEMO_CLIENT_SECRET),
    )


@pytest.mark.parametrize(
    "exchange",
    [
        _missing_verifier,
        _wrong_verifier,
        _verifier_without_challenge,
        _used_twice,
        _another_client,
        _another_redirect,
    ],
)
async def test_a_code_exchanges_once_for_its_client_redirect_and_verifier(
    flow: Flow, exchange: Callable[[Flow], Awaitable[httpx.Response]]
) -> None:
    """A code without its verifier, used twice, or for another client or redirect: invalid_grant."""
    response = await exchange(flow)
    assert (response.status_code, response.json()["error"]) == (400, "invalid_grant")


@pytest.mark.parametrize(("seconds", "status"), [(59, 200), (60, 400)])
async def test_code_expires_after_60_seconds(flow: Flow, seconds: int, status: int) -> None:
    """A code exchanges within 60 s of the sim clock and not after."""
    code = await flow.code("alice")
    flow.sim.advance(seconds)
    assert (await flow.exchange(code)).status_code == status


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("grant_type=refresh_token&refresh_token=x", "unsupported_grant_type"),
        ("grant_type=authorization_code", "invalid_request"),
        ("grant_type=authorization_code&code=a&code=b", "invalid_request"),
    ],
    ids=["grant-type", "no-code", "repeated-parameter"],
)
async def test_malformed_token_requests_are_refused(flow: Flow, body: str, error: str) -> None:
    """Unsupported grants, missing codes and repeated parameters get OAuth errors."""
    response = await flow.http.post(
        "/auth/oidc/token",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        auth=(DEMO_CLIENT_ID, DEMO_CLIENT_SECRET),
    )
    assert response.status_code == 400
    assert response.json()["error"] == error


# -- enrollment refusals ----------------------------------------------------------------------


async def _long_term_credential(flow: Flow) -> dict[str, str]:
    return bearer(await flow.enrolled())


async def _expired_user_token(flow: Flow) -> dict[str, str]:
    token = await flow.user_token("alice")
    flow.sim.advance(3600)
    return bearer(token)


async def _no_long_term_scope(flow: Flow) -> dict[str, str]:
    return bearer(await flow.user_token("alice", [HISTORY_SCOPE]))


async def _mode_withdrawn_since(flow: Flow) -> dict[str, str]:
    token = await flow.user_token("alice")
    flow.sim.withdraw_mode(DEMO_CLIENT_ID)
    return bearer(token)


REFUSALS: dict[str, tuple[Any, int, str | None]] = {
    "long-term-credential": (_long_term_credential, 401, None),  # spec 5.4
    "no-token": ({}, 401, None),
    "unknown-user-token": (bearer("unknown-user-token"), 401, None),
    "basic": ({"Authorization": "Basic x"}, 401, None),
    "expired-user-token": (_expired_user_token, 401, None),
    "no-long-term-scope": (_no_long_term_scope, 403, "insufficient_scope"),
    "mode-withdrawn-since": (_mode_withdrawn_since, 403, "invalid_scope"),
}


@pytest.mark.parametrize(("given", "status", "error"), REFUSALS.values(), ids=REFUSALS.keys())
async def test_enrollment_refusals(flow: Flow, given: Any, status: int, error: str | None) -> None:
    """Enrollment without a live user token holding a long term scope is refused."""
    headers = given if isinstance(given, dict) else await given(flow)
    response = await flow.http.post(TOKENS, headers=headers)
    assert response.status_code == status
    assert response.json().get("error") == error
    if status == 401:
        assert response.json() == {"message": "Unauthorized"}


@pytest.mark.parametrize("status", [200, 201, 202])
async def test_enrollment_success_status_is_configurable(
    flow: Flow, sim: Simulator, status: int
) -> None:
    """The success status of token creation is whatever 2xx the simulator is set to."""
    sim.configure(enroll_status=status)
    token = await flow.user_token("alice")
    response = await flow.http.post(TOKENS, headers=bearer(token))
    assert response.status_code == status
    assert response.json()["token"].startswith("dspa_")


# -- the two authentication modes -------------------------------------------------------------


async def test_both_modes_return_the_same_payload(flow: Flow) -> None:
    """A regular user token with DS-API-CLIENT-ID and a long term credential read the same."""
    credential = await flow.enrolled()
    user_token = await flow.user_token("alice", [HISTORY_SCOPE])
    regular = bearer(user_token) | {"DS-API-CLIENT-ID": DEMO_CLIENT_ID}
    for path in (LATEST, STATS):
        long_term = await flow.http.get(path, headers=bearer(credential))
        ordinary = await flow.http.get(path, headers=regular)
        assert long_term.status_code == ordinary.status_code == 200
        assert long_term.json() == ordinary.json()


@pytest.mark.parametrize(
    ("client_header", "scopes", "advance", "status"),
    [
        (DEMO_CLIENT_ID, [HISTORY_SCOPE], 0, 200),
        (None, [HISTORY_SCOPE], 0, 401),
        (PLAIN_CLIENT_ID, [HISTORY_SCOPE], 0, 401),
        (DEMO_CLIENT_ID, list(LONG_TERM_SCOPES), 0, 403),
        (DEMO_CLIENT_ID, [HISTORY_SCOPE], 3600, 401),
    ],
    ids=["ok", "no-client-header", "other-client-header", "no-history-scope", "expired"],
)
async def test_regular_mode_rules(
    flow: Flow,
    client_header: str | None,
    scopes: list[str],
    advance: int,
    status: int,
) -> None:
    """Regular mode needs the matching client header, cloud-sync.history and a live token."""
    token = await flow.user_token("alice", scopes)
    flow.sim.advance(advance)
    headers = bearer(token) | ({"DS-API-CLIENT-ID": client_header} if client_header else {})
    response = await flow.http.get(STATS, headers=headers)
    assert response.status_code == status


@pytest.mark.parametrize(
    "path",
    ["/api/v1/history/changes", "/api/v1/history/accidents", "/api/v1/stocks", "/api/v1/types"],
)
async def test_other_endpoints_refuse_a_valid_long_term_credential(flow: Flow, path: str) -> None:
    """Endpoints outside the two reads answer a long term credential with a plain 401."""
    credential = await flow.enrolled()
    user_token = await flow.user_token("alice", [HISTORY_SCOPE])
    refused = await flow.http.get(path, headers=bearer(credential))
    accepted = await flow.http.get(
        path, headers=bearer(user_token) | {"DS-API-CLIENT-ID": DEMO_CLIENT_ID}
    )
    assert (refused.status_code, refused.json()) == (401, {"message": "Unauthorized"})
    assert accepted.status_code == 200


def test_default_client_secrets_are_overridable() -> None:
    """The demo secrets can be replaced; a secret with a dot is refused."""
    sim = Simulator(clients=default_clients(demo_secret="mine", plain_secret="other"))
    assert sim.client_secret(DEMO_CLIENT_ID) == "mine"
    assert sim.client_secret(PLAIN_CLIENT_ID) == "other"
    with pytest.raises(ValueError, match=r"no '\.'"):
        default_clients(demo_secret="a.b")
