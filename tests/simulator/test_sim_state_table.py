"""Spec section 3, one test per row of the state table (plus what each row implies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    LATEST_CHANGE_SCOPE,
    LONG_TERM_SCOPES,
    STATS_SCOPE,
    Simulator,
)

from .helpers import LATEST, STATS, TOKENS, Flow, bearer

pytestmark = pytest.mark.anyio

Trigger = Callable[[Flow, str], Awaitable[None]]


async def _rotate(flow: Flow, _credential: str) -> None:
    new = await flow.enroll("alice")
    assert (await flow.http.get(STATS, headers=bearer(new))).status_code == 200


async def _user_revokes(flow: Flow, _credential: str) -> None:
    flow.sim.revoke("alice")


async def _account_deleted(flow: Flow, _credential: str) -> None:
    flow.sim.delete_account("alice")


async def _operator_withdraws(flow: Flow, _credential: str) -> None:
    flow.sim.withdraw_mode(DEMO_CLIENT_ID)


async def _client_drops(flow: Flow, credential: str) -> None:
    response = await flow.http.delete(TOKENS, headers=bearer(credential))
    assert response.status_code == 204


async def _sync_silent(flow: Flow, _credential: str) -> None:
    flow.sim.set_sync("alice", last_sync_age_days=91)


@dataclass(frozen=True)
class Row:
    """One row of the state table from Active: its trigger and the next call's answer."""

    trigger: Trigger
    status: int
    code: str | None


ROWS = {
    "repeat-enrollment-rotates": Row(_rotate, 401, None),
    "user-revokes": Row(_user_revokes, 401, "PermanentAccessRevoked"),
    "account-deleted": Row(_account_deleted, 401, "PermanentAccessRevoked"),
    "operator-withdraws-mode": Row(_operator_withdraws, 401, "PermanentAccessRevoked"),
    "client-drops-token": Row(_client_drops, 401, None),
    "sync-silent-over-90-days": Row(_sync_silent, 403, "CloudSyncInactive"),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_transition_from_active(flow: Flow, row: Row) -> None:
    """Each trigger on an Active access gives the next call the answer the table says."""
    credential = await flow.enrolled()
    assert (await flow.http.get(LATEST, headers=bearer(credential))).status_code == 200
    await row.trigger(flow, credential)
    response = await flow.http.get(LATEST, headers=bearer(credential))
    assert response.status_code == row.status
    assert response.json().get("error") == row.code
    if row.code is None:  # a plain 401: the same answer as for a token never issued
        assert response.json() == {"message": "Unauthorized"}


async def test_none_to_active_returns_token_once_with_user_token_scopes(flow: Flow) -> None:
    """Enrollment returns a dspa_ token once, with exactly the long term scopes consented."""
    flow.sim.add_user("alice")
    access_token = await flow.user_token("alice", [LATEST_CHANGE_SCOPE])
    response = await flow.http.post(TOKENS, headers=bearer(access_token))
    assert response.status_code == 201
    body = response.json()
    assert body["token"].startswith("dspa_")
    assert "." not in body["token"]
    assert body["scopes"] == [LATEST_CHANGE_SCOPE]
    assert body["token"] not in str(flow.sim.user_info("alice"))
    assert all(body["token"] not in key for key in flow.sim.world.grants)


async def test_enrollment_scopes_never_exceed_what_the_user_left_ticked(flow: Flow) -> None:
    """A user who unticks a scope at consent gets a token with the other scope only."""
    flow.sim.add_user("alice")
    code = await flow.code("alice", LONG_TERM_SCOPES, granted=[STATS_SCOPE])
    token = (await flow.exchange(code)).json()["access_token"]
    response = await flow.http.post(TOKENS, headers=bearer(token))
    assert response.json()["scopes"] == [STATS_SCOPE]
    credential = f"{response.json()['token']}.{DEMO_CLIENT_SECRET}"
    assert (await flow.http.get(LATEST, headers=bearer(credential))).status_code == 403
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


async def test_user_revocation_never_names_the_revoker(flow: Flow, sim: Simulator) -> None:
    """The revoked answer is the same whoever revoked, and names nobody."""
    answers = []
    for user, revoke in (
        ("alice", lambda: sim.revoke("alice")),
        ("bob", lambda: sim.withdraw_mode(DEMO_CLIENT_ID)),
    ):
        sim.reopen_mode(DEMO_CLIENT_ID)
        sim.add_user(user)
        credential = await flow.enroll(user)
        revoke()
        answers.append((await flow.http.get(STATS, headers=bearer(credential))).content)
    assert answers[0] == answers[1]
    assert b"user" not in answers[0].lower()
    assert b"operator" not in answers[0].lower()


async def test_account_deletion_revokes_every_access_of_the_account(
    flow: Flow, sim: Simulator, http: httpx.AsyncClient
) -> None:
    """Deleting the account revokes its accesses at every client, not others' accesses."""
    sim.add_client("second-client", "second-secret", long_term=True)
    sim.add_user("alice")
    sim.add_user("bob")
    at_demo = await flow.enroll("alice")
    token = await flow.user_token("alice", client=("second-client", "second-secret"))
    created = await http.post(TOKENS, headers=bearer(token))
    at_second = f"{created.json()['token']}.second-secret"
    bob = await flow.enroll("bob")
    assert sim.delete_account("alice") == 2
    for credential in (at_demo, at_second):
        response = await http.get(STATS, headers=bearer(credential))
        assert (response.status_code, response.json()["error"]) == (401, "PermanentAccessRevoked")
    assert (await http.get(STATS, headers=bearer(bob))).status_code == 200


async def test_operator_withdrawal_revokes_every_token_of_the_client_only(
    flow: Flow, sim: Simulator, http: httpx.AsyncClient
) -> None:
    """Withdrawing the mode revokes all the client's tokens at once; another client keeps its."""
    sim.add_client("second-client", "second-secret", long_term=True)
    for user in ("alice", "bob", "carol"):
        sim.add_user(user)
    alice, bob = await flow.enroll("alice"), await flow.enroll("bob")
    token = await flow.user_token("carol", client=("second-client", "second-secret"))
    carol = f"{(await http.post(TOKENS, headers=bearer(token))).json()['token']}.second-secret"
    assert sim.withdraw_mode(DEMO_CLIENT_ID) == 2
    for credential in (alice, bob):
        response = await http.get(LATEST, headers=bearer(credential))
        assert response.json()["error"] == "PermanentAccessRevoked"
    assert (await http.get(LATEST, headers=bearer(carol))).status_code == 200


@pytest.mark.parametrize(
    ("after_delete", "code"), [("plain", None), ("revoked", "PermanentAccessRevoked")]
)
async def test_after_client_drop_the_answer_is_configurable(
    flow: Flow, sim: Simulator, after_delete: str, code: str | None
) -> None:
    """A token the client dropped answers a plain 401, or PermanentAccessRevoked if configured."""
    sim.configure(after_delete=after_delete)
    credential = await flow.enrolled()
    assert (await flow.http.delete(TOKENS, headers=bearer(credential))).status_code == 204
    response = await flow.http.get(STATS, headers=bearer(credential))
    assert response.status_code == 401
    assert response.json().get("error") == code


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer dspa_unknown.whatever",
        "Bearer not-a-long-term-token",
        "Basic Zm9vOmJhcg==",
        "Bearer dspa_missing-secret",
    ],
)
async def test_drop_always_answers_204(flow: Flow, authorization: str | None) -> None:
    """DELETE answers 204 whether or not the credential names a token."""
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await flow.http.delete(TOKENS, headers=headers)
    assert response.status_code == 204
    assert response.content == b""


async def test_drop_with_wrong_secret_keeps_the_token(flow: Flow) -> None:
    """A DELETE whose client secret is wrong answers 204 but drops nothing."""
    credential = await flow.enrolled()
    token = credential.split(".", 1)[0]
    response = await flow.http.delete(TOKENS, headers=bearer(f"{token}.wrong-secret"))
    assert response.status_code == 204
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


async def test_inactivity_keeps_the_token_and_access_resumes_by_itself(flow: Flow) -> None:
    """CloudSyncInactive leaves the token valid; once syncing resumes the same token reads."""
    credential = await flow.enrolled()
    flow.sim.set_sync("alice", last_sync_age_days=120)
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 403
    flow.sim.set_sync("alice", last_sync_age_days=0)
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


async def test_reads_update_last_used_shown_in_connected_services(flow: Flow) -> None:
    """The account page lists the access with its scopes, grant time and last use."""
    credential = await flow.enrolled()
    flow.sim.advance(600)
    await flow.http.get(STATS, headers=bearer(credential))
    (service,) = flow.sim.user_info("alice")["connected_services"]
    assert service["client"] == DEMO_CLIENT_ID
    assert service["scopes"] == list(LONG_TERM_SCOPES)
    assert service["granted_at"] == "2025-01-01T00:00:00Z"
    assert service["last_used_at"] == "2025-01-01T00:10:00Z"
