"""Helpers of the simulator's tests: constants, PKCE, and `Flow`, a client of the real endpoints."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    LONG_TERM_SCOPES,
    Simulator,
)

BASE = "http://sim.test"
REDIRECT = "http://127.0.0.1/lta/callback"
LATEST = "/api/v1/history/latest-change"
STATS = "/api/v1/history/stats"
TOKENS = "/auth/api/long-term-access/tokens"


def pkce_pair() -> tuple[str, str]:
    """A PKCE (verifier, S256 challenge) pair."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def bearer(credential: str) -> dict[str, str]:
    """An Authorization header carrying `credential`."""
    return {"Authorization": f"Bearer {credential}"}


@dataclass
class Flow:
    """Drives consent, code exchange and enrollment through the HTTP endpoints."""

    sim: Simulator
    http: httpx.AsyncClient

    async def authorize(
        self,
        scopes: Iterable[str] = LONG_TERM_SCOPES,
        *,
        client_id: str = DEMO_CLIENT_ID,
        challenge: str | None = None,
        state: str = "st4te",
    ) -> httpx.Response:
        """GET /auth/oidc/auth with the usual parameters."""
        params = {
            "client_id": client_id,
            "redirect_uri": REDIRECT,
            "response_type": "code",
            "scope": " ".join(["openid", *scopes]),
            "state": state,
        }
        if challenge is not None:
            params |= {"code_challenge": challenge, "code_challenge_method": "S256"}
        return await self.http.get("/auth/oidc/auth", params=params)

    async def code(
        self,
        user: str,
        scopes: Iterable[str] = LONG_TERM_SCOPES,
        *,
        granted: list[str] | None = None,
        client_id: str = DEMO_CLIENT_ID,
        challenge: str | None = None,
    ) -> str:
        """Queue the user's consent and return the authorization code of the redirect."""
        self.sim.queue_consent(user, granted)
        response = await self.authorize(scopes, client_id=client_id, challenge=challenge)
        assert response.status_code == 302, response.text
        return httpx.URL(response.headers["location"]).params["code"]

    async def exchange(
        self,
        code: str,
        *,
        verifier: str | None = None,
        client: tuple[str, str] = (DEMO_CLIENT_ID, DEMO_CLIENT_SECRET),
    ) -> httpx.Response:
        """POST /auth/oidc/token with client_secret_basic."""
        data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
        if verifier is not None:
            data["code_verifier"] = verifier
        return await self.http.post("/auth/oidc/token", data=data, auth=client)

    async def user_token(
        self,
        user: str,
        scopes: Iterable[str] = LONG_TERM_SCOPES,
        *,
        client: tuple[str, str] = (DEMO_CLIENT_ID, DEMO_CLIENT_SECRET),
    ) -> str:
        """A fresh user access token for `user` with `scopes` (PKCE included)."""
        verifier, challenge = pkce_pair()
        code = await self.code(user, scopes, client_id=client[0], challenge=challenge)
        response = await self.exchange(code, verifier=verifier, client=client)
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])

    async def enrolled(
        self, user: str = "alice", scopes: Iterable[str] = LONG_TERM_SCOPES, **account: Any
    ) -> str:
        """Create `user` (with `account`'s settings), enroll it, return the credential."""
        self.sim.add_user(user, **account)
        return await self.enroll(user, scopes)

    async def enroll(self, user: str, scopes: Iterable[str] = LONG_TERM_SCOPES) -> str:
        """Enroll `user` and return the long term credential `<token>.<client secret>`."""
        access_token = await self.user_token(user, scopes)
        response = await self.http.post(TOKENS, headers=bearer(access_token))
        assert response.status_code == 201, response.text
        return f"{response.json()['token']}.{DEMO_CLIENT_SECRET}"


def code_of(response: httpx.Response, style: str) -> str | None:
    """The error code of an answer, read the way `style` carries it (None: no code)."""
    if style == "header":
        match = re.search(r'error="([^"]+)"', response.headers.get("www-authenticate", ""))
        return match.group(1) if match else None
    body = response.json()
    if style == "json":
        return body.get("error")
    if style == "code":
        return body.get("code")
    if style == "nested":
        return body["errors"][0].get("code")
    assert style == "problem"
    assert response.headers["content-type"] == "application/problem+json"
    return None if body["type"] == "about:blank" else body["title"]
