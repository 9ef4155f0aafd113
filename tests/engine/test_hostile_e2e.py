"""The real Worker against a scripted hostile server on loopback (issue 12): hostile answers
end a pass normally, write the whole batch, store no credential (figures and error bodies:
test_read_path_fuzz.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lta_worker.config import Settings, build_settings
from lta_worker.errors import EnrollmentError
from lta_worker.report import result_json, user_json
from lta_worker.runtime import Runtime
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from lta_worker.worker import PassResult, Worker
from support.hostile import HostileServer, Seen, Step, json_body

from .conftest import ON_BOTH_BACKENDS, write_files

pytestmark = pytest.mark.anyio

CLIENT_SECRET = "hostile-client-s3cret-value"
SCOPES = ["cloud-sync.permanent.latest-change", "cloud-sync.permanent.stats"]
TOKENS_PATH = "/api/long-term-access/tokens"
READ_PREFIX = "/api/v1/history/"
MAX_WAIT = 10


def token_of(user: str) -> str:
    return f"dspa_{user}_t0ken"


@dataclass
class Deployment:
    """A hostile server answering reads per user, and a worker deployment pointed at it."""

    server: HostileServer
    settings: Settings
    reads: dict[str, Step | Callable[[Seen], Step]]
    tokens: dict[str, str] = field(default_factory=dict)  # a token other than `token_of`
    scopes: dict[str, list[str]] = field(default_factory=dict)  # scopes other than SCOPES

    def respond(self, seen: Seen) -> Step | None:
        if seen.path == TOKENS_PATH and seen.method == "POST":
            user = seen.headers["authorization"].removeprefix("Bearer uat-")
            token = self.tokens.get(user, token_of(user))
            scopes = self.scopes.get(user, SCOPES)
            return Step(200, body=json_body({"token": token, "scopes": scopes}))
        if seen.path.startswith(READ_PREFIX):
            auth = seen.headers.get("authorization", "")
            for user, step in self.reads.items():
                if auth.startswith(f"Bearer {token_of(user)}."):
                    return step(seen) if callable(step) else step
        return None

    def store(self) -> Store:
        store = Store.open(self.settings.database.url)
        store.upgrade()
        return store

    async def enroll(self, *users: str) -> None:
        async with Runtime(self.settings) as runtime:
            enrollment = runtime.enrollment()
            for user in users:
                await enrollment.from_user_token(user, Secret(f"uat-{user}"))

    async def run_pass(self) -> PassResult:
        async with Worker(self.settings) as worker:
            return await worker.run_pass(max_duration=timedelta(seconds=60))

    def users(self) -> list[dict[str, Any]]:
        with self.store() as store:
            return [user_json(row) for row in store.list_users()]

    def export(self) -> list[str]:
        with self.store() as store:
            return [
                json.dumps(result_json(row), separators=(",", ":"), allow_nan=False)
                for row in store.export_results(None)
            ]


@pytest.fixture
def deployment(tmp_path: Path, db_url: str) -> Iterator[Deployment]:
    secret_file, key_file = write_files(tmp_path, CLIENT_SECRET)
    reads: dict[str, Step | Callable[[Seen], Step]] = {}
    holder: list[Deployment] = []
    server = HostileServer(
        default=Step(500), respond=lambda seen: holder[0].respond(seen) if holder else None
    )
    with server:
        settings = build_settings(
            {
                "service": {"base_url": server.url, "auth_url": server.url, "read_timeout": "5s"},
                "client": {"id": "hostile-client", "secret_file": str(secret_file)},
                "database": {"url": db_url},
                "crypto": {"key_file": str(key_file)},
                "poll": {"concurrency": 2, "batch_size": 10},
                # Permits are spread over the (bounded) reset: 10 s keeps a pass short.
                "ratelimit": {"fallback_per_hour": 360_000, "max_wait": f"{MAX_WAIT}s"},
            }
        )
        holder.append(Deployment(server, settings, reads))
        yield holder[0]


OK = Step(200, body=b'{"n": 1}')


@ON_BOTH_BACKENDS
async def test_a_payload_that_is_not_strict_json_never_blocks_its_batch(
    deployment: Deployment,
) -> None:
    """The poisoned user's read is a broken body; its batch-mates are written and exported (NaN
    and infinities as broken bodies: tests/domain/test_classify.py)."""
    deployment.reads["bad"] = Step(200, body=b'{"n": 1e999}')
    deployment.reads["good"] = OK
    await deployment.enroll("bad", "good")
    result = await deployment.run_pass()
    assert result.exit_code == 0
    users = {u["user"]: u for u in deployment.users()}
    assert users["bad"]["last_outcome"] == "transient"
    assert users["good"]["last_outcome"] == "ok"
    lines = deployment.export()
    assert [json.loads(line)["user"] for line in lines] == ["good", "good"]
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in an export"))


def _escaped(text: str) -> str:
    """`text` with its first letter as a JSON \\u escape (the same string once parsed)."""
    return f"\\u{ord(text[0]):04x}{text[1:]}"


ECHOES: Mapping[str, Callable[[str], bytes]] = {
    "the-header": lambda auth: json_body({"echo": auth}),
    "the-token": lambda auth: json_body({"t": auth.removeprefix("Bearer ").split(".")[0]}),
    "the-secret": lambda auth: json_body({"nested": [{"s": auth.rsplit(".", 1)[1]}]}),
    "the-token-escaped": lambda auth: (
        '{"t": "' + _escaped(auth.removeprefix("Bearer ").split(".")[0]) + '"}'
    ).encode(),
    "the-secret-escaped": lambda auth: ('{"s": "' + _escaped(CLIENT_SECRET) + '"}').encode(),
}


FOREIGN: Mapping[str, Callable[[str], bytes]] = {
    "plain": lambda token: json_body({"owner": {"note": token}}),
    "in-free-text": lambda token: json_body({"n": 1, "msg": f"see {token} for c1"}),
    "escaped": lambda token: ('{"t": "' + _escaped(token) + '"}').encode(),
    "prefix-escaped": lambda token: ('{"t": "dspa\\u005f' + token[5:] + '"}').encode(),
}
SECRET_BODIES: Mapping[str, Callable[[str], bytes]] = {
    **ECHOES,  # the reading user's own credential, from its Authorization header
    **{f"foreign-{k}": lambda _, make=make: make(token_of("c1")) for k, make in FOREIGN.items()},
}


@pytest.mark.parametrize("case", list(SECRET_BODIES))
async def test_a_success_body_holding_a_credential_is_never_stored_or_logged(
    deployment: Deployment, case: str, db_url: str, log_stream: io.StringIO
) -> None:
    """A 200 holding the user's token or secret, or another user's `dspa_` token, is not stored."""
    body = SECRET_BODIES[case]
    deployment.reads["e1"] = lambda seen: Step(200, body=body(seen.headers["authorization"]))
    deployment.reads["c1"] = OK
    await deployment.enroll("c1", "e1")
    result = await deployment.run_pass()
    assert result.exit_code == 0
    users = {u["user"]: u for u in deployment.users()}
    assert users["e1"]["last_outcome"] == "transient"
    assert users["e1"]["has_token"] and users["e1"]["state"] == "active"
    assert users["c1"]["last_outcome"] == "ok"
    with deployment.store() as store:
        history = [json.dumps(result_json(row)) for row in store.export_history()]
        assert [row.user for row in store.export_history("e1")] == []
    lines = deployment.export()
    assert [json.loads(line)["user"] for line in lines] == ["c1", "c1"]
    secrets = (token_of("e1"), token_of("c1"), CLIENT_SECRET)
    assert not any(secret in line for secret in secrets for line in [*lines, *history])
    if db_url.startswith("sqlite"):
        path = Path(db_url.removeprefix("sqlite:///"))
        for part in path.parent.glob(path.name + "*"):  # the file, its WAL and journal
            raw = part.read_bytes()
            assert token_of("e1").encode() not in raw and CLIENT_SECRET.encode() not in raw
    rendered = log_stream.getvalue()
    reads = [json.loads(line) for line in rendered.splitlines()]
    broken = [e for e in reads if e["event"] == "poll.read" and e["user"] == "e1"]
    assert broken and all(e["reason"] == "credential echoed" for e in broken)
    assert "dspa_" not in rendered and CLIENT_SECRET not in rendered


UNSENDABLE = {
    "non-ascii": "dspa_caf\u00e9_t0ken",
    "space": "dspa_two words",
    "crlf": "dspa_a\r\nX-Injected: 1",
    "nul": "dspa_a\u0000b",
}


@pytest.mark.parametrize("case", list(UNSENDABLE))
async def test_a_token_no_header_can_carry_is_refused_at_enrollment(
    deployment: Deployment, case: str
) -> None:
    """A created token an Authorization header cannot carry is refused; nothing is stored."""
    deployment.tokens["u1"] = UNSENDABLE[case]
    with pytest.raises(EnrollmentError, match="cannot be sent"):
        await deployment.enroll("u1")
    assert deployment.users() == []


@pytest.mark.parametrize("case", list(UNSENDABLE))
async def test_a_stored_token_no_header_can_carry_skips_its_user_only(
    deployment: Deployment, case: str
) -> None:
    """A stored token no header can carry fails its user alone; nothing is sent with it."""
    deployment.reads["good"] = OK
    await deployment.enroll("good")
    with deployment.store() as store:
        vault = Vault.from_settings(deployment.settings)
        now = datetime.now(UTC)
        bad = vault.encrypt(Secret(UNSENDABLE[case]), user="bad")
        store.store_token("bad", bad, SCOPES, now, now)
    result = await deployment.run_pass()
    assert result.exit_code == 0, result
    assert result.counts["ok"] == 2 and result.counts["undecryptable"] == 1
    users = {u["user"]: u for u in deployment.users()}
    assert users["bad"]["has_token"] and users["bad"]["state"] == "active"
    assert users["bad"]["last_outcome"] == "undecryptable"
    sent = [seen.headers.get("authorization", "") for seen in deployment.server.requests()]
    assert not any(UNSENDABLE[case][:8] in auth for auth in sent)


async def test_a_pass_whose_every_answer_is_a_429_is_throttled_not_completed(
    deployment: Deployment,
) -> None:
    """Every read a 429: the pass ends `throttled` (75), not `completed`; users unchanged."""
    storm = Step(429, headers=[("Retry-After", "0")])
    deployment.reads["u1"] = storm
    deployment.reads["u2"] = storm
    await deployment.enroll("u1", "u2")
    result = await deployment.run_pass()
    assert (result.stopped, result.exit_code) == ("throttled", 75), result
    assert result.counts["rate_limited"] == result.reads > 0
    users = {u["user"]: u for u in deployment.users()}
    assert all(u["state"] == "active" and u["has_token"] for u in users.values())


async def test_scopes_granted_beyond_the_long_term_ones_are_not_stored(
    deployment: Deployment,
) -> None:
    """A grant listing junk or regular scopes beside a long term one stores that one alone."""
    deployment.scopes["u1"] = ["admin", SCOPES[0], "cloud-sync.history", "\u0000", "x" * 300]
    await deployment.enroll("u1")
    (user,) = deployment.users()
    assert user["scopes"] == [SCOPES[0]]


async def test_a_grant_without_a_long_term_scope_is_refused_and_its_token_dropped(
    deployment: Deployment,
) -> None:
    """A grant without a long term scope stores nothing and drops the token made."""
    deployment.scopes["u1"] = ["admin", "\u0000"]
    with pytest.raises(EnrollmentError, match="none of the long term scopes"):
        await deployment.enroll("u1")
    assert deployment.users() == []
    deletes = [s for s in deployment.server.requests(TOKENS_PATH) if s.method == "DELETE"]
    assert [d.headers["authorization"] for d in deletes] == [
        f"Bearer {token_of('u1')}.{CLIENT_SECRET}"
    ]
