"""The webhook events as pure rules, the signing sender, and the `[webhook]` settings."""

from __future__ import annotations

import base64
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from lta_worker.config import build_settings, read_webhook_secret
from lta_worker.domain import (
    EVENT_TYPES,
    USER_STATES,
    PendingEvent,
    UserUpdate,
    change_event,
    enrollment_event,
    turn_events,
)
from lta_worker.domain._events import CLIENT_ACTIONS
from lta_worker.errors import ConfigError
from lta_worker.secret import Secret
from lta_worker.upstream import WebhookSender, webhook_http_client
from support.configs import BASE
from support.schemas import webhook_problems

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
pytestmark = pytest.mark.anyio


def settings(**webhook: Any) -> Any:
    """Settings with a `[webhook]` section."""
    return build_settings({**BASE, "webhook": webhook})


@pytest.mark.parametrize("state", USER_STATES)
def test_every_state_change_is_an_event_with_a_client_action(state: str) -> None:
    """A change into any state is an event named after it, with the spec's client action."""
    old = "dropping" if state == "active" else "active"
    event = change_event("u", old, state, NOW, "why")  # type: ignore[arg-type]
    assert event is not None
    assert event.type == ("user.active" if state == "active" else f"user.{state}")
    assert event.payload()["data"]["client_action"] == CLIENT_ACTIONS[event.type]
    assert change_event("u", state, state, NOW) is None  # type: ignore[arg-type]


def test_event_names_cover_the_issue_list() -> None:
    """Enrolled, rotated, scope denied, back to active and result.changed are events too."""
    assert set(EVENT_TYPES) == {
        "user.enrolled",
        "user.rotated",
        "user.revoked",
        "user.parked",
        "user.unlinked",
        "user.rejected",
        "user.scope_denied",
        "user.dropping",
        "user.dropped",
        "user.forgotten",
        "user.active",
        "result.changed",
    }
    assert enrollment_event("u", None, False, NOW).type == "user.enrolled"
    assert enrollment_event("u", "active", True, NOW).type == "user.rotated"


def test_turn_events_state_then_each_newly_denied_endpoint() -> None:
    """A turn yields its state change first, then one scope_denied per endpoint newly denied."""
    upd = UserUpdate(
        user_id=1,
        state="active",
        next_due_at=None,
        consecutive_failures=0,
        last_outcome="ok",
        denied={"stats": NOW, "latest-change": NOW},
    )
    events = turn_events("u", "parked", {"latest-change": NOW}, upd, NOW)
    assert [(e.type, e.endpoint) for e in events] == [
        ("user.active", None),
        ("user.scope_denied", "stats"),
    ]
    assert [p for e in events for p in webhook_problems(e.payload())] == []


def pending() -> PendingEvent:
    event = change_event("u", "active", "revoked", NOW, "PermanentAccessRevoked")
    assert event is not None
    return PendingEvent(1, "msg_1", "u", event.type, event.payload(), NOW, 1)


async def test_the_library_verifies_what_the_sender_signs() -> None:
    """A POST verifies with standardwebhooks' Webhook.verify; a wrong secret does not."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    cfg = settings(url="https://hooks.example/x")
    async with webhook_http_client(cfg.webhook, transport=httpx.MockTransport(handler)) as http:
        sender = WebhookSender(http, cfg.webhook, Secret(SECRET))
        assert await sender.send(pending(), datetime.now(UTC)) is None
    (request,) = seen
    headers = dict(request.headers)
    assert headers["webhook-id"] == "msg_1"
    assert Webhook(SECRET).verify(request.content, headers) == json.loads(request.content)
    other = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(request.content, headers)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(503, "HTTP 503"), (301, "HTTP 301"), ("drop", "ConnectError"), ("hang", "timeout")],
)
async def test_a_failed_delivery_says_why_and_never_raises(answer: Any, expected: str) -> None:
    """A non-2xx, broken connection or timeout is a reason string, never an exception."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if answer == "drop":
            raise httpx.ConnectError("refused", request=request)
        if answer == "hang":
            await anyio.sleep_forever()
        return httpx.Response(answer, headers={"location": "https://elsewhere.example/"})

    cfg = settings(url="https://hooks.example/x", timeout="1s")
    async with webhook_http_client(cfg.webhook, transport=httpx.MockTransport(handler)) as http:
        sender = WebhookSender(http, cfg.webhook, Secret(SECRET))
        with anyio.fail_after(5):
            assert await sender.send(pending(), NOW) == expected


@pytest.mark.parametrize(
    ("url", "accepted"),
    [
        ("https://hooks.example/lta", True),
        ("http://127.0.0.1:8080/lta", True),
        ("http://hooks.example/lta", False),
        ("https://user:pw@hooks.example/lta", False),
        ("ftp://hooks.example/lta", False),
    ],
)
def test_webhook_url_rules(url: str, accepted: bool) -> None:
    """https anywhere, http only to loopback, never credentials in the URL."""
    if accepted:
        assert settings(url=url).webhook.url == url
    else:
        with pytest.raises(ConfigError) as info:
            settings(url=url)
        assert "webhook.url" in str(info.value.key)


@pytest.mark.parametrize(
    ("content", "mode", "ok"),
    [
        (SECRET + "\n", 0o600, True),
        (SECRET, 0o644, False),
        ("not-a-whsec-secret", 0o600, False),
        ("whsec_c2hvcnQ=", 0o600, False),  # 5 bytes: too short
        ("whsec_!!!notbase64!!!", 0o600, False),
    ],
    # Fixed ids: no secret in a test name (and every parallel worker collects the same ones).
    ids=["valid", "world-readable", "not-whsec", "too-short", "not-base64"],
)
def test_webhook_secret_file_rules(tmp_path: Path, content: str, mode: int, ok: bool) -> None:
    """The secret file holds one whsec_ secret under the secret-file rule; errors hide it."""
    path = tmp_path / "hook-secret"
    path.write_text(content)
    path.chmod(mode)
    cfg = settings(url="https://hooks.example/x", secret_file=str(path))
    if ok:
        assert read_webhook_secret(cfg).reveal() == SECRET
        return
    with pytest.raises(ConfigError) as info:
        read_webhook_secret(cfg)
    assert info.value.key == "webhook.secret_file"
    assert content.strip() not in str(info.value)


def test_a_webhook_url_without_a_secret_file_is_a_config_error() -> None:
    """webhook.url set and no secret file: exit 78 naming webhook.secret_file."""
    with pytest.raises(ConfigError) as info:
        read_webhook_secret(settings(url="https://hooks.example/x"))
    assert info.value.key == "webhook.secret_file"
    assert info.value.exit_code == 78


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (None, EVENT_TYPES),
        (["result.changed"], ("result.changed",)),
        (["user.revoked", "user.revoked", "result.changed"], ("user.revoked", "result.changed")),
        ("user.revoked, result.changed", ("user.revoked", "result.changed")),  # environment
        (["user.revoked", "result.change"], "'result.change' is not an event type"),
        (["User.Revoked"], "is not an event type"),
        ([], "at least one event type"),
        ("", "at least one event type"),
        (5, "expected a list of strings"),
    ],
)
def test_events_setting(events: Any, expected: Any) -> None:
    """`events` lists known types (env: space or comma separated); else refused naming it."""
    given = {} if events is None else {"events": events}
    if isinstance(expected, tuple):
        assert settings(**given).webhook.events == expected
        return
    with pytest.raises(ConfigError, match=expected) as info:
        settings(**given)
    assert (info.value.key, info.value.exit_code) == ("webhook.events", 78)


@pytest.mark.parametrize(
    ("url", "events", "include_content", "mode"),
    [
        (None, None, None, "off"),
        ("https://hooks.example/x", None, None, "hash"),
        ("https://hooks.example/x", None, True, "content"),
        ("https://hooks.example/x", None, "true", "content"),  # environment
        ("https://hooks.example/x", None, "0", "hash"),
        ("https://hooks.example/x", ["user.revoked"], True, "off"),
    ],
)
def test_what_storage_writes_of_result_changed(
    url: str | None, events: Any, include_content: Any, mode: str
) -> None:
    """result.changed is written only for a receiver of it: hashes, content with include_content."""
    given = {
        k: v
        for k, v in {"url": url, "events": events, "include_content": include_content}.items()
        if v is not None
    }
    assert settings(**given).webhook.result_events == mode


@pytest.mark.parametrize("value", ["maybe", 2, "yes please"])
def test_include_content_takes_true_or_false_only(value: Any) -> None:
    """A value that is not a boolean is refused naming `webhook.include_content`."""
    with pytest.raises(ConfigError) as info:
        settings(include_content=value)
    assert info.value.key == "webhook.include_content"
