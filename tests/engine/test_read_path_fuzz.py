"""Hypothesis through the whole read path (classify, pacer, rendered `poll.read`, store, budget
row, export) on SQLite and PostgreSQL: nothing raises, all JSON strict, figures bounded."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lta_worker.config import RateLimitSettings, Settings, build_settings
from lta_worker.domain import Answer, Endpoint, Proof, echoes
from lta_worker.domain._outcomes import ALLOWED_CODES
from lta_worker.pacing import Pacer, PacerCore
from lta_worker.pacing._ratelimit import parse_ratelimit
from lta_worker.pacing._shared import Settlement, observation, transact
from lta_worker.pacing._window import MAX_COUNT
from lta_worker.report import result_json, user_json
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from lta_worker.worker import PassEngine, pass_options
from support.hostile import hostile_ratelimit_headers

from .conftest import ON_BOTH_BACKENDS, write_files

CLIENT_SECRET = "fuzz-client-s3cret-value"
ECHO = "EchoedFreeTextXyz"
MAX_WAIT = 600.0
HUGE = 999_999_999_999_999
START = datetime(2025, 1, 1, tzinfo=UTC)
SCOPES = ("cloud-sync.permanent.latest-change", "cloud-sync.permanent.stats")


class Clocks:
    """Wall and monotonic time that only the pacer's waits move (`jump`); the engine's own
    timers sleep for real."""

    def __init__(self) -> None:
        self.wall = START
        self.mono = 1000.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    async def jump(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)
        await anyio.lowlevel.checkpoint()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class Scripted:
    """A Reader answering every read with the example, marked `echoed` as the API client does."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        status, body = self.answer.status, self.answer.body
        secrets = (token.reveal().encode(), CLIENT_SECRET.encode())
        echoed = status is not None and 200 <= status < 300 and echoes(body, secrets)
        return replace(self.answer, echoed=echoed)

    async def prove(self, proof: Proof) -> bool | None:
        return None


@pytest.fixture
def deployment(tmp_path: Path, db_url: str) -> Iterator[tuple[Settings, Store]]:
    secret_file, key_file = write_files(tmp_path, CLIENT_SECRET, START)
    config = build_settings(
        {
            "service": {"base_url": "https://api.example", "auth_url": "https://api.example"},
            "client": {"id": "fuzz-client", "secret_file": str(secret_file)},
            "database": {"url": db_url},
            "crypto": {"key_file": str(key_file)},
            "ratelimit": {"max_wait": f"{MAX_WAIT}s"},
        }
    )
    with Store.open(db_url) as store:
        store.upgrade()
        yield config, store


_strict = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
).map(lambda value: json.dumps(value).encode())
_hostile = st.sampled_from(
    [
        b'{"n": 1e999}',
        b'{"n": -1e400, "m": [NaN]}',
        b"[Infinity]",
        b'{"s": "\\ud800"}',
        json.dumps({"error": CLIENT_SECRET}).encode(),
        json.dumps({"error": ECHO, "code": ECHO}).encode(),
        json.dumps({"errors": [{"code": ECHO}]}).encode(),
        b'{"error": "PermanentAccessRevoked"}',
        b'{"error": "CloudSyncInactive"}',
        b'{"error": "invalid_token"}',
        b"",
    ]
)
bodies = st.one_of(_strict, _hostile, st.binary(max_size=40))
statuses = st.sampled_from([200, 204, 401, 403, 404, 429, 500, 503])


@ON_BOTH_BACKENDS
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=hostile_ratelimit_headers(), status=statuses, body=bodies)
@example(headers={}, status=404, body=b"")  # the engine notes 404s per user, until routed
@example(headers={}, status=500, body=json.dumps({"error": CLIENT_SECRET}).encode())
@example(headers={}, status=401, body=json.dumps({"error": ECHO, "code": ECHO}).encode())
@example(headers={}, status=503, body=json.dumps({"errors": [{"code": ECHO}]}).encode())
@example(  # counts past a PostgreSQL integer, a reset 31 years ahead
    headers={"ratelimit": f'"p";r={HUGE};t=999999999', "ratelimit-policy": f'"p";q={HUGE};w=60'},
    status=200,
    body=b'{"n": 1}',
)
def test_any_answer_goes_through_the_whole_read_path(
    deployment: tuple[Settings, Store],
    log_stream: io.StringIO,
    headers: dict[str, str],
    status: int,
    body: bytes,
) -> None:
    """Any answer: no raise from response to export, nothing per user left in the engine."""
    config, store = deployment
    clocks = Clocks()
    clocks.wall = store_wall = _next_wall(store)
    vault = Vault.from_settings(config)
    token = vault.encrypt(Secret("dspa_fuzzT0ken"), user="fz")
    store.store_token("fz", token, SCOPES, now=store_wall, next_due_at=store_wall)
    pacer = Pacer(
        PacerCore(
            RateLimitSettings(
                reserve=0.0, max_wait=timedelta(seconds=MAX_WAIT), fallback_per_hour=3600.0 * 1000
            )
        ),
        clocks.monotonic,
        clocks.jump,
        wall_clock=clocks.now,
    )
    engine = PassEngine(
        store=store,
        vault=vault,
        api=Scripted(Answer(status=status, headers=headers, body=body)),
        pacer=pacer,
        clock=clocks,
        options=pass_options(config, "fuzz", timedelta(seconds=60)),
        rng=random.Random(0),
    )
    logs_from = log_stream.tell()
    anyio.run(engine.run)
    # Nothing per user outlives its turn (a pass over a million users must not grow with
    # them).
    assert not engine.turns.saw_404
    assert not engine.writer.claimed

    # The rendered log lines: strict JSON, bounded budget fields, allowed codes only.
    log_stream.seek(logs_from)
    reads = 0
    for line in log_stream.read().splitlines():
        event = json.loads(line, parse_constant=_refuse)
        assert CLIENT_SECRET not in line and ECHO not in line
        if event["event"] == "poll.read":
            reads += 1
            assert event["code"] is None or event["code"] in ALLOWED_CODES
            assert event["budget_reset_s"] is None or event["budget_reset_s"] <= MAX_WAIT + 1
            for key in ("budget_remaining", "budget_limit"):
                assert event[key] is None or 0 <= event[key] <= MAX_COUNT
    assert reads >= 1

    # The pacer's record and the shared row take whatever was reported.
    seen = pacer.budget_seen(clocks.now())
    if seen is not None:
        store.record_budget("fuzz-client", seen)
    info = parse_ratelimit(headers, clocks.now())
    shared = observation(info, status, clocks.now(), max_wait=MAX_WAIT)
    back = Settlement("uncounted", True, shared)
    fn = partial(
        transact,
        backs=[back],
        now=clocks.now(),
        want=1,
        reserve=0.1,
        probe_timeout=timedelta(seconds=30),
    )
    store.update_budget("fuzz-client", fn)
    row = store.budget_seen("fuzz-client")
    if row is not None and row.reset_at is not None:
        assert row.reset_at <= clocks.now() + timedelta(seconds=MAX_WAIT + 1)

    # What the CLI shows and exports.
    user = store.get_user("fz")
    assert user is not None
    assert user.last_code is None or user.last_code in ALLOWED_CODES
    shown = json.dumps(user_json(user))
    assert CLIENT_SECRET not in shown and ECHO not in shown
    for result in store.export_results("fz"):
        line = json.dumps(result_json(result), separators=(",", ":"), allow_nan=False)
        json.loads(line, parse_constant=_refuse)


def _next_wall(store: Store) -> datetime:
    """A wall time after every earlier example (a day later), so the user is due again."""
    row = store.get_user("fz")
    if row is None or row.last_polled_at is None:
        return START
    return max(row.last_polled_at, row.next_due_at or START) + timedelta(days=1)


def _refuse(constant: str) -> Any:
    raise AssertionError(f"{constant} is not JSON")
