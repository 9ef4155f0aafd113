"""Enrollment in the browser, in-process: the ASGI app of `/enroll/start` and the callback driven
with httpx (a cookie-keeping "browser") against the simulator's consent page, every path."""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from lta_worker.config import LATEST_CHANGE_SCOPE, LONG_TERM_SCOPES
from lta_worker.enrollment import BrowserFlow, EnrollLinks, build_enroll_app
from lta_worker.enrollment._browser import state_for
from lta_worker.enrollment._web import SECURITY_HEADERS
from lta_worker.secret import Secret
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    PLAIN_CLIENT_ID,
    PLAIN_CLIENT_SECRET,
    ManualClock,
    Simulator,
    SimulatorTransport,
)
from lta_worker.storage import Store, Vault
from support.storage import stored_verifiers

from .conftest import AUTH_URL, make_world

pytestmark = pytest.mark.anyio

APP = "https://app.example"
CALLBACK = f"{APP}/lta/callback"
RETURN = "https://app.example/settings?tab=sync"
KEY = Secret("k" * 40)
SECURITY = {
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}


@dataclass
class Browser:
    """A cookie-keeping client that reaches the worker's app and the simulator."""

    http: httpx.AsyncClient
    sim: Simulator
    clock: ManualClock
    store: Store
    vault: Vault
    links: EnrollLinks
    answers: list[httpx.Response]

    async def get(self, url: str) -> httpx.Response:
        response = await self.http.get(url)
        self.answers.append(response)
        return response

    async def open_link(self, user: str = "alice", valid: timedelta = timedelta(hours=1)) -> str:
        """Open a fresh link; return the consent URL it redirects to."""
        response = await self.get(self.links.make(user, self.clock.now(), valid))
        assert response.status_code == 303, response.text
        return response.headers["location"]

    async def consent(self, url: str, decision: str, scopes: list[str] | None = None) -> str:
        """On the simulator's consent page, tick `scopes` (all by default) and decide."""
        page = await self.http.get(url)
        assert page.status_code == 200, page.text
        request_id = re.search(r'name="request" value="([^"]+)"', page.text)
        assert request_id is not None
        ticked = LONG_TERM_SCOPES if scopes is None else scopes
        form = [("request", request_id.group(1)), ("account", "svc-alice")]
        form += [("scope", s) for s in ticked] + [("decision", decision)]
        answer = await self.http.post(
            f"{AUTH_URL}/oidc/consent",
            content=urlencode(form),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code == 303, answer.text
        location = answer.headers["location"]
        assert "/lta/callback?" in location
        return location


async def _browser(
    store: Store,
    *,
    client: tuple[str, str] = (DEMO_CLIENT_ID, DEMO_CLIENT_SECRET),
    public_url: str = APP,
    return_url: str | None = None,
) -> AsyncIterator[Browser]:
    clock = ManualClock()
    sim = Simulator(clock=clock)
    sim.configure(consent_page=True)
    for client_id in (DEMO_CLIENT_ID, PLAIN_CLIENT_ID):
        sim.add_redirect_uri(client_id, f"{public_url}/lta/callback")
    links = EnrollLinks([KEY], f"{public_url}/enroll/start")
    async for world in make_world(sim, clock, store, *client, public_url=public_url):
        app = build_enroll_app(
            BrowserFlow(world.enrollment(), store, links, clock.now),
            start_path="/enroll/start",
            callback_path="/lta/callback",
            secure=public_url.startswith("https"),
            return_url=return_url,
        )
        mounts = {
            f"all://{urlsplit(public_url).hostname}": httpx.ASGITransport(app=app),
            "all://api.sim.example": SimulatorTransport(sim),
        }
        async with httpx.AsyncClient(mounts=mounts) as http:
            yield Browser(http, sim, clock, store, world.vault, links, [])


@pytest.fixture
async def browser(store: Store) -> AsyncIterator[Browser]:
    async for made in _browser(store):
        yield made


def outcome_of(response: httpx.Response) -> str:
    found = re.search(r'data-outcome="([a-z_]+)"', response.text)
    assert found is not None, response.text
    return found.group(1)


async def test_untick_a_scope_allow_and_land_on_success(browser: Browser) -> None:
    """Allow with a scope unticked lands on the success page; the user is stored with the rest."""
    consent = await browser.open_link()
    callback = await browser.consent(consent, "allow", [LATEST_CHANGE_SCOPE])
    page = await browser.get(callback)
    assert page.status_code == 200
    assert outcome_of(page) == "enrolled"
    assert "your latest change" in page.text and "statistics" not in page.text
    row = browser.store.get_user("alice")
    assert row is not None
    assert (row.state, row.scopes) == ("active", (LATEST_CHANGE_SCOPE,))
    assert row.granted("latest-change") and not row.granted("stats")


async def test_start_sets_a_hardened_single_use_cookie_bound_to_the_state(
    browser: Browser,
) -> None:
    """The start's cookie is hardened, opaque, derives the consent's state, and is cleared after."""
    consent = await browser.open_link()
    start = browser.answers[-1]
    raw = start.headers["set-cookie"]
    jar = SimpleCookie()
    jar.load(raw)
    morsel = jar["__Host-lta-enroll"]
    assert morsel["httponly"] and morsel["secure"]
    assert morsel["samesite"].lower() == "lax"
    assert (morsel["path"], morsel["max-age"]) == ("/", "600")
    state = parse_qs(urlsplit(consent).query)["state"][0]
    assert morsel.value != state
    assert state == state_for(morsel.value)
    assert "code_verifier" not in consent
    page = await browser.get(await browser.consent(consent, "allow"))
    assert page.status_code == 200
    cleared = page.headers["set-cookie"]
    assert cleared.startswith("__Host-lta-enroll=") and "Max-Age=0" in cleared


async def test_plain_http_public_url_gives_a_cookie_without_secure(store: Store) -> None:
    """A loopback http public URL gets a cookie without Secure or __Host-; the flow completes."""
    async for browser in _browser(store, public_url="http://127.0.0.1:8080"):
        consent = await browser.open_link()
        raw = browser.answers[-1].headers["set-cookie"]
        assert raw.startswith("lta-enroll=") and "secure" not in raw.lower()
        page = await browser.get(await browser.consent(consent, "allow"))
        assert outcome_of(page) == "enrolled"


@pytest.mark.parametrize(
    ("name", "status", "outcome"),
    [
        ("denied", 403, "denied"),
        ("replayed", 410, "link_used"),
        ("expired", 410, "link_expired"),
        ("tampered", 400, "link_invalid"),
        ("no_link", 400, "link_invalid"),
        ("other_key", 400, "link_invalid"),
        ("no_cookie", 400, "no_cookie"),
        ("wrong_state", 400, "state_mismatch"),
        ("non_ascii_state", 400, "state_mismatch"),
        ("consent_expired", 410, "consent_expired"),
        ("no_answer", 400, "bad_request"),
    ],
)
async def test_each_failure_has_its_page_and_status(
    browser: Browser, name: str, status: int, outcome: str
) -> None:
    """Each failure of the flow gets its page and status, and no token is stored."""
    link = browser.links.make("alice", browser.clock.now(), timedelta(hours=1))
    if name == "denied":
        consent = await browser.open_link()
        response = await browser.get(await browser.consent(consent, "deny"))
    elif name == "replayed":
        await browser.get(link)
        response = await browser.get(link)
    elif name == "expired":
        browser.clock.advance(3601)
        response = await browser.get(link)
    elif name == "tampered":
        response = await browser.get(link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB"))
    elif name == "no_link":
        response = await browser.get(f"{APP}/enroll/start")
    elif name == "other_key":
        other = EnrollLinks([Secret("o" * 40)], f"{APP}/enroll/start")
        response = await browser.get(other.make("alice", browser.clock.now(), timedelta(hours=1)))
    elif name == "no_cookie":
        callback = await browser.consent(await browser.open_link(), "allow")
        browser.http.cookies.clear()
        response = await browser.get(callback)
    elif name == "wrong_state":
        callback = await browser.consent(await browser.open_link(), "allow")
        response = await browser.get(callback.replace("state=", "state=x"))
    elif name == "non_ascii_state":  # any text is a mismatch, not a crash
        callback = await browser.consent(await browser.open_link(), "allow")
        response = await browser.get(callback.replace("state=", "state=%C3%A9"))
    elif name == "consent_expired":
        callback = await browser.consent(await browser.open_link(), "allow")
        browser.clock.advance(11 * 60)
        response = await browser.get(callback)
    else:
        response = await browser.get(CALLBACK)
    assert (response.status_code, outcome_of(response)) == (status, outcome)
    assert browser.store.get_user("alice") is None or name == "denied"
    row = browser.store.get_user("alice")
    assert row is None or row.token is None


async def test_invalid_scope_gets_the_not_available_page(store: Store) -> None:
    """`invalid_scope` at the consent gets the 503 "not available yet" page; nothing is stored."""
    async for browser in _browser(store, client=(PLAIN_CLIENT_ID, PLAIN_CLIENT_SECRET)):
        consent = await browser.open_link()
        refused = await browser.http.get(consent)
        assert refused.status_code == 302
        assert "error=invalid_scope" in refused.headers["location"]
        page = await browser.get(refused.headers["location"])
        assert (page.status_code, outcome_of(page)) == (503, "not_available")
        assert store.get_user("alice") is None


@pytest.mark.parametrize("decision", ["allow", "deny"])
async def test_return_url_gets_the_outcome_and_nothing_secret(store: Store, decision: str) -> None:
    """With enroll.return_url the callback redirects there with the outcome, never code or state."""
    async for browser in _browser(store, return_url=RETURN):
        callback = await browser.consent(await browser.open_link(), decision)
        response = await browser.get(callback)
        assert response.status_code == 303
        location = response.headers["location"]
        assert location.startswith(RETURN + "&")
        query = parse_qs(urlsplit(location).query)
        assert query["tab"] == ["sync"]
        if decision == "allow":
            assert query["outcome"] == ["enrolled"]
            assert query["user"] == ["alice"]
            assert query["scopes"] == [" ".join(LONG_TERM_SCOPES)]
        else:
            assert query["outcome"] == ["denied"]
        code = parse_qs(urlsplit(callback).query).get("code", [""])[0]
        assert code == "" or code not in location
        assert "state" not in query


async def test_every_answer_carries_the_security_headers(browser: Browser) -> None:
    """Every answer, 404 and 405 included, carries CSP, no-referrer, nosniff and no-store."""
    await browser.get(await browser.consent(await browser.open_link(), "allow"))
    browser.answers.append(await browser.http.get(f"{APP}/nowhere"))
    browser.answers.append(await browser.http.post(f"{APP}/enroll/start"))
    assert [a.status_code for a in browser.answers] == [303, 200, 404, 405]
    for answer in browser.answers:
        for name, value in SECURITY.items():
            assert answer.headers[name] == value
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/enroll/start/?link=L", "/lta/callback/?code=C&state=S"])
async def test_a_trailing_slash_is_not_redirected_with_its_query(
    browser: Browser, path: str
) -> None:
    """`/path/` is a 404, not a Host-built redirect that would carry the link or code elsewhere."""
    response = await browser.http.get(f"{APP}{path}", headers={"host": "attacker.example"})
    assert response.status_code == 404
    assert "location" not in response.headers
    for name, value in SECURITY.items():
        assert response.headers[name] == value


async def test_no_token_code_or_verifier_reaches_the_browser_or_the_log(
    browser: Browser, rendered_logs: io.StringIO
) -> None:
    """No answer of the app and no log line holds the code, the token or the verifier."""
    consent = await browser.open_link()
    callback = await browser.consent(consent, "allow")
    code = parse_qs(urlsplit(callback).query)["code"][0]
    page = await browser.get(callback)
    assert page.status_code == 200
    row = browser.store.get_user("alice")
    assert row is not None and row.token is not None
    token = browser.vault.decrypt(row.token, user="alice").reveal()
    verifiers = stored_verifiers(browser.store, browser.vault)
    assert len(verifiers) == 1
    seen = (
        "\n".join(f"{a.status_code} {a.headers.raw!r} {a.text}" for a in browser.answers)
        + rendered_logs.getvalue()
    )
    assert '"event": "enroll.page"' in rendered_logs.getvalue()
    for secret in (code, token, *verifiers):
        assert secret not in seen
    assert "code_verifier" not in seen
    assert "/lta/callback?" not in rendered_logs.getvalue()


class _BrokenFlow(BrowserFlow):
    """A flow with a bug at the start."""

    def __init__(self) -> None:
        pass

    async def start(self, link: str | None) -> Any:
        raise RuntimeError("a bug")


async def test_a_bug_gets_a_500_page_with_the_headers_and_one_log_event(
    rendered_logs: io.StringIO,
) -> None:
    """A bug in the flow answers the 500 page with the headers and logs one `enroll.page` error."""
    app = build_enroll_app(
        _BrokenFlow(), start_path="/enroll/start", callback_path="/lta/callback", secure=True
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=APP) as http:
        response = await http.get("/enroll/start?link=x")
    assert response.status_code == 500
    assert outcome_of(response) == "failed"
    assert response.headers["cache-control"] == "no-store"
    logged = rendered_logs.getvalue()
    assert '"error": "RuntimeError"' in logged and '"status": 500' in logged


async def test_a_head_request_uses_up_neither_the_link_nor_the_code(browser: Browser) -> None:
    """A HEAD of a link or the callback (link checkers) has no effect; the GETs then enroll."""
    link = browser.links.make("alice", browser.clock.now(), timedelta(hours=1))
    for _ in range(2):
        head = await browser.http.head(link)
        assert head.status_code == 200
        assert "set-cookie" not in head.headers and "location" not in head.headers
        assert head.headers["cache-control"] == SECURITY_HEADERS["cache-control"]
    started = await browser.get(link)
    assert started.status_code == 303
    callback = await browser.consent(started.headers["location"], "allow")
    head = await browser.http.head(callback)
    assert (head.status_code, "set-cookie" in head.headers) == (200, False)
    assert browser.store.get_user("alice") is None  # the code is not exchanged by a HEAD
    page = await browser.get(callback)
    assert (page.status_code, outcome_of(page)) == (200, "enrolled")


async def test_a_link_issued_before_a_forget_is_refused_and_a_new_one_enrolls(
    browser: Browser,
) -> None:
    """After `forget`, an older link is refused as expired; a newer one enrolls the id afresh."""
    await browser.get(await browser.consent(await browser.open_link(), "allow"))
    old = browser.links.make("alice", browser.clock.now(), timedelta(hours=1))
    browser.clock.advance(1)
    browser.store.begin_drop("alice", browser.clock.now(), purge=True)
    browser.clock.advance(1)
    page = await browser.get(old)
    assert (page.status_code, outcome_of(page)) == (410, "link_expired")
    assert browser.store.get_user("alice").state == "dropping"  # type: ignore[union-attr]
    await browser.get(await browser.consent(await browser.open_link(), "allow"))
    assert browser.store.get_user("alice").state == "active"  # type: ignore[union-attr]
