"""No token, user access token, code, verifier or client secret in logs or error messages."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import structlog
from structlog.typing import EventDict, WrappedLogger

from lta_worker.enrollment import Enrollment
from lta_worker.errors import LtaError
from lta_worker.logs import REDACTED
from lta_worker.secret import Secret
from support.enroll import query_of
from support.storage import stored_verifiers

from .conftest import REDIRECT_URI, World
from .test_enrollment import _user_access_token

pytestmark = pytest.mark.anyio


class RawEvents:
    """A first processor that keeps each event dict as the code handed it to the logger."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, _logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
        self.events.append(dict(event))
        return event


async def test_logs_and_errors_hold_no_secret(world: World, rendered_logs: io.StringIO) -> None:
    """A full life (enroll, rotate, failures, drop, forget) renders no planted secret."""
    raw = RawEvents()
    structlog.configure(processors=[raw, *structlog.get_config()["processors"]])
    enrollment: Enrollment = world.enrollment()
    planted: list[str] = [world.client_secret.reveal()]
    errors: list[str] = []

    for _ in range(2):  # enroll, then rotate
        location = await world.consent(enrollment.start("alice"), "svc-alice")
        planted.append(query_of(location)["code"])
        await enrollment.finish("alice", location)
        planted.append(world.token_of("alice").reveal())

    # Failures: a reused state, a code with the wrong verifier, a bad user token.
    try:
        await enrollment.finish("alice", location)
    except LtaError as exc:
        errors.append(str(exc))
    first, second = enrollment.start("bob"), enrollment.start("bob")
    code = query_of(await world.consent(first, "svc-bob"))["code"]
    planted.append(code)
    try:
        await enrollment.finish(
            "bob", f"{REDIRECT_URI}?code={code}&state={query_of(second)['state']}"
        )
    except LtaError as exc:
        errors.append(str(exc))
    user_token = await _user_access_token(world, "svc-carol")
    planted.append(user_token.reveal())
    await enrollment.from_user_token("carol", user_token)
    planted.append(world.token_of("carol").reveal())
    bogus = Secret("bogus-user-access-token-123")
    planted.append(bogus.reveal())
    try:
        await enrollment.from_user_token("dave", bogus)
    except LtaError as exc:
        errors.append(str(exc))

    await world.lifecycle().drop("alice")
    await world.lifecycle().forget("carol")
    planted += stored_verifiers(world.store, world.vault)

    rendered = rendered_logs.getvalue()
    events = [json.loads(line) for line in rendered.splitlines()]
    names = {e["event"] for e in events}
    assert {"enroll.started", "enroll.completed", "enroll.failed", "user.dropped"} <= names
    assert {"token.deleted"} <= names
    assert len(errors) == 3
    assert len(planted) >= 10
    raw_text = repr(raw.events)
    for value in planted:
        assert len(value) >= 8
        assert value not in rendered
        assert value not in raw_text
        assert all(value not in message for message in errors)
    assert "dspa_" not in rendered
    assert "dspa_" not in raw_text
    assert REDACTED not in rendered  # nothing needed masking: no secret was ever logged


async def test_enroll_failed_names_the_stage(world: World, rendered_logs: io.StringIO) -> None:
    """enroll.failed carries user, stage and error_code, as docs/log-events.md says."""
    enrollment = world.enrollment()
    location = await world.consent(enrollment.start("alice"), "svc-alice")
    await enrollment.finish("alice", location)
    with pytest.raises(LtaError):
        await enrollment.finish("alice", location)
    events = [json.loads(line) for line in rendered_logs.getvalue().splitlines()]
    failed = [e for e in events if e["event"] == "enroll.failed"]
    assert [(e["user"], e["stage"], e["level"]) for e in failed] == [("alice", "state", "warning")]
    completed = next(e for e in events if e["event"] == "enroll.completed")
    assert completed["scopes"] == list(world.settings.client.scopes)
    assert completed["rotated"] is False
    started = next(e for e in events if e["event"] == "enroll.started")
    assert started["expires_at"]
