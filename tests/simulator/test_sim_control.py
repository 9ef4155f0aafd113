"""The control API under /_sim/, the request log, and what neither may ever reveal."""

from __future__ import annotations

import base64

import httpx
import pytest

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    LATEST_CHANGE_SCOPE,
    PLAIN_CLIENT_SECRET,
    ControlError,
    Simulator,
    SimulatorTransport,
)
from lta_worker.simulator.state import default_payloads, latest_change

from .helpers import BASE, LATEST, STATS, TOKENS, Flow, bearer, pkce_pair

pytestmark = pytest.mark.anyio


async def _credential_over_http(flow: Flow, user: str) -> str:
    """Enroll `user`, queuing the consent through the control API as the operator does."""
    verifier, challenge = pkce_pair()
    assert (await flow.http.post("/_sim/consent", json={"user": user})).status_code == 202
    consent = await flow.authorize(challenge=challenge)
    code = httpx.URL(consent.headers["location"]).params["code"]
    exchanged = await flow.exchange(code, verifier=verifier)
    created = await flow.http.post(TOKENS, headers=bearer(exchanged.json()["access_token"]))
    return f"{created.json()['token']}.{DEMO_CLIENT_SECRET}"


# A control call on the user, then what the next read answers.
STEPS = [
    ("PUT", "/_sim/users/alice/payloads", {"latest-change": None}, LATEST, 404, None),
    ("PUT", "/_sim/users/alice/sync", {"linked": False}, STATS, 401, "NoCloudSyncLinked"),
    ("PUT", "/_sim/users/alice/sync", {"linked": True, "last_sync_age_days": 91}, STATS, 403,
     "CloudSyncInactive"),
    ("PUT", "/_sim/users/alice/sync", {"last_sync_age_days": 0}, STATS, 200, None),
    ("POST", "/_sim/users/alice/revoke", {}, STATS, 401, "PermanentAccessRevoked"),
]  # fmt: skip


async def test_user_lifecycle_through_the_control_api(http: httpx.AsyncClient, flow: Flow) -> None:
    """Users, sync, payloads, revocation and deletion all work over /_sim/."""
    body = {"user": "alice", "last_sync_age_days": 2, "payloads": {"stats": {"n": 1}}}
    created = await http.post("/_sim/users", json=body)
    assert (created.status_code, created.json()["last_sync_at"]) == (201, "2024-12-30T00:00:00Z")
    credential = await _credential_over_http(flow, "alice")
    assert (await http.get(STATS, headers=bearer(credential))).json() == {"n": 1}
    for method, path, json, read, status, error in STEPS:
        answer = await http.request(method, path, json=json)
        got = await http.get(read, headers=bearer(credential))
        assert (got.status_code, got.json().get("error")) == (status, error), json
    assert answer.json() == {"revoked": 1}  # the revocation's
    assert (await http.delete("/_sim/users/alice")).json() == {"revoked": 0}
    assert (await http.get("/_sim/users/alice")).status_code == 404


async def test_client_controls_through_the_control_api(http: httpx.AsyncClient, flow: Flow) -> None:
    """Withdraw, reopen and untick scopes over /_sim/; client info never shows the secret."""
    await http.post("/_sim/users", json={"user": "alice"})
    credential = await _credential_over_http(flow, "alice")
    unticked = await http.put(
        f"/_sim/clients/{DEMO_CLIENT_ID}/scopes", json={"scopes": [LATEST_CHANGE_SCOPE]}
    )
    assert unticked.json()["scopes"] == [LATEST_CHANGE_SCOPE]
    assert (await http.get(STATS, headers=bearer(credential))).status_code == 403
    assert (await http.post(f"/_sim/clients/{DEMO_CLIENT_ID}/withdraw")).json() == {"revoked": 1}
    info = (await http.post(f"/_sim/clients/{DEMO_CLIENT_ID}/reopen")).json()
    assert info["long_term"] is True
    assert info["tokens"] == 0
    answer = await http.get(LATEST, headers=bearer(credential))
    assert answer.json()["error"] == "PermanentAccessRevoked"
    added = await http.post(
        "/_sim/clients", json={"client": "new-client", "secret": "s3cr3t", "long_term": True}
    )
    assert added.status_code == 201
    index = await http.get("/_sim/")
    assert [c["id"] for c in index.json()["clients"]] == [
        DEMO_CLIENT_ID,
        "new-client",
        "plain-client",
    ]
    for text in (index.text, added.text):
        assert DEMO_CLIENT_SECRET not in text
        assert PLAIN_CLIENT_SECRET not in text
        assert "s3cr3t" not in text


async def test_settings_budget_faults_and_clock_through_the_control_api(
    http: httpx.AsyncClient,
) -> None:
    """Settings, budget, faults and the clock are readable and settable over /_sim/."""
    settings = await http.put(
        "/_sim/settings", json={"budget": 5, "window": 60, "header_format": "triple"}
    )
    assert (settings.json()["budget"], settings.json()["window"]) == (5, 60)
    assert (await http.get("/_sim/settings")).json()["header_format"] == "triple"
    consumed = await http.post("/_sim/budget/consume", json={"client": DEMO_CLIENT_ID, "count": 4})
    assert consumed.json() == {"client": DEMO_CLIENT_ID, "remaining": 1}
    assert (await http.get(f"/_sim/budget/{DEMO_CLIENT_ID}")).json()["remaining"] == 1
    rule = await http.post(
        "/_sim/faults", json={"kind": "latency", "next": 2, "ms": 250, "seed": 3}
    )
    assert rule.status_code == 201
    assert rule.json() == {"kind": "latency", "rate": None, "remaining": 2, "delay": 0.25}
    assert (await http.get("/_sim/faults")).json()["seed"] == 3
    assert (await http.delete("/_sim/faults")).status_code == 204
    assert (await http.get("/_sim/faults")).json()["rules"] == []
    moved = await http.post("/_sim/clock", json={"advance": 90})
    assert moved.json() == {"now": "2025-01-01T00:01:30Z"}
    jumped = await http.post("/_sim/clock", json={"set": "2025-02-01T12:00:00+00:00"})
    assert jumped.json() == {"now": "2025-02-01T12:00:00Z"}
    assert (await http.get("/_sim/clock")).json() == {"now": "2025-02-01T12:00:00Z", "manual": True}


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/_sim/users/ghost", None, 404),
        ("GET", "/_sim/clients/ghost", None, 404),
        ("POST", "/_sim/users", {"user": "a", "linked": "yes"}, 400),
        ("POST", "/_sim/users", {"user": ""}, 400),
        ("PUT", "/_sim/settings", {"budgets": 3}, 400),
        ("PUT", "/_sim/settings", {"header_format": "fancy"}, 400),
        ("PUT", "/_sim/settings", {"error_style": "xml"}, 400),
        ("PUT", "/_sim/settings", {"window": 0}, 400),
        ("PUT", "/_sim/settings", {"enroll_status": 204}, 400),
        ("PUT", "/_sim/clients/demo-client/scopes", {"scopes": ["cloud-sync.history"]}, 400),
        ("POST", "/_sim/faults", {"kind": "500"}, 400),
        ("POST", "/_sim/budget/consume", {"client": "demo-client", "count": True}, 400),
        ("POST", "/_sim/clock", {"set": "tomorrow"}, 400),
        ("POST", "/_sim/clients", {"client": "c", "secret": "has.dot"}, 400),
    ],
)
async def test_control_api_refuses_bad_requests(
    http: httpx.AsyncClient, method: str, path: str, body: object, status: int
) -> None:
    """Unknown names, wrong types and invalid values get a 4xx with an error message."""
    response = await http.request(method, path, json=body)
    assert response.status_code == status
    assert response.json()["error"]


async def test_control_api_refuses_a_body_that_is_not_a_json_object(
    http: httpx.AsyncClient,
) -> None:
    """A control body must be a JSON object."""
    assert (await http.post("/_sim/users", content=b"not json")).status_code == 400
    assert (await http.post("/_sim/users", json=[1, 2])).status_code == 400


async def test_clock_control_needs_a_manual_clock() -> None:
    """On the real clock, moving time is refused with 409."""
    sim = Simulator()
    async with httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as http:
        response = await http.post("/_sim/clock", json={"advance": 10})
    assert response.status_code == 409
    with pytest.raises(ControlError):
        sim.advance(1)


async def test_reset_restores_the_initial_simulator(flow: Flow, sim: Simulator) -> None:
    """POST /_sim/reset forgets users, tokens, settings, faults and the log."""
    credential = await flow.enrolled()
    sim.configure(budget=1)
    sim.inject_fault("500", rate=1.0)
    assert (await flow.http.post("/_sim/reset")).status_code == 204
    assert sim.settings.budget == 120
    assert sim.faults.rules == []
    assert sim.requests() == []
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 401
    assert sim.client_info(DEMO_CLIENT_ID)["long_term"] is True


async def test_request_log_never_contains_a_credential(flow: Flow, sim: Simulator) -> None:
    """No token, code, verifier or secret reaches the request log, in any form."""
    sim.add_user("alice")
    verifier, challenge = pkce_pair()
    code = await flow.code("alice", challenge=challenge)
    exchanged = await flow.exchange(code, verifier=verifier)
    user_token = exchanged.json()["access_token"]
    created = await flow.http.post(TOKENS, headers=bearer(user_token))
    token = created.json()["token"]
    credential = f"{token}.{DEMO_CLIENT_SECRET}"
    await flow.http.get(STATS, headers=bearer(credential))
    await flow.http.get(STATS, headers=bearer(f"{token}.wrong-secret-value"))
    await flow.http.get(STATS, headers=bearer(user_token) | {"DS-API-CLIENT-ID": DEMO_CLIENT_ID})
    await flow.http.delete(TOKENS, headers=bearer(credential))
    log = (await flow.http.get("/_sim/requests")).text
    basic = base64.b64encode(f"{DEMO_CLIENT_ID}:{DEMO_CLIENT_SECRET}".encode()).decode()
    secrets = [user_token, token, DEMO_CLIENT_SECRET, code, verifier, challenge, basic]
    for secret in [*secrets, "wrong-secret-value", "dspa_"]:
        assert secret not in log
        assert secret not in repr(sim.requests())
    assert "?" not in log
    entries = (await flow.http.get("/_sim/requests")).json()
    assert set(entries[0]) == {
        "method", "path", "auth", "client", "user", "status", "code", "at", "fault"
    }  # fmt: skip
    assert [e["auth"] for e in entries[3:7]] == ["long_term", "long_term", "regular", "long_term"]
    assert (await flow.http.delete("/_sim/requests")).status_code == 204
    assert (await flow.http.get("/_sim/requests")).json() == []


async def test_state_keeps_only_hashes_of_tokens_and_codes(flow: Flow, sim: Simulator) -> None:
    """The service's records hold no usable token or code, only their hashes."""
    credential = await flow.enrolled()
    pending = await flow.code("alice")
    state = repr(sim.world)
    assert credential.split(".", 1)[0] not in state
    assert pending not in state
    assert DEMO_CLIENT_SECRET not in state


async def test_default_payloads_are_deterministic_per_user(flow: Flow, sim: Simulator) -> None:
    """A user's default payloads depend only on the user id, and differ between users."""
    credential = await flow.enrolled()
    response = await flow.http.get(LATEST, headers=bearer(credential))
    assert response.json() == latest_change("alice")
    assert default_payloads("alice") == default_payloads("alice")
    assert default_payloads("alice") != default_payloads("bob")
