"""Where a pass's CPU goes beyond the reads: each step of a user's turn timed on its own.

No network: the same functions the engine calls, on realistic inputs (tokens encrypted by
the vault, the simulator's payloads and RateLimit headers, a SQLite store of the same
users). Figures are microseconds per read (a user's turn has two reads), so they can be
set against the CPU per read that B1 measures end to end.

One figure looks at the whole rather than a step, **engine alone**: a real
`Worker.run_pass` whose reader answers from memory (the simulator's payloads and headers),
so everything but the network and the HTTP client: claim, decrypt, pace, classify, decide,
log, store, and the tasks and streams between them. B1's worker CPU per read is roughly
this plus the ApiClient-only CPU per read.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from bench.common import Workspace, bulk_store_tokens, cpu_seconds, make_all_due, quiet_logs

HEADERS = {
    "content-type": "application/json",
    "ratelimit": '"default";r=999999000;t=3000',
    "ratelimit-policy": '"default";q=1000000000;w=3600',
    "date": "Mon, 01 Jan 2024 00:00:00 GMT",
}


def _per(total_s: float, count: float) -> float:
    return round(1e6 * total_s / count, 1)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def engine_costs(users: int = 1000) -> dict[str, float]:
    """Microseconds per read of each step of a turn (the store's steps per user / 2)."""
    reads = 2 * users
    out = _turn_costs(users)
    with quiet_logs("info"):
        out["log poll.read (JSON, redacted)"] = _per(_log_events(reads), reads)
    out["pacer acquire + feed"] = _per(anyio.run(_pacer, reads), reads)
    out["engine alone: a whole pass, answers from memory (CPU per read)"] = _engine_alone(users)
    label = "sniffio" if sniffio_installed() else "failed `import sniffio`"
    out[f"httpcore: current_async_library, {label} (x7 per request)"] = _per(
        anyio.run(_sniffio, reads), reads / 7
    )
    return out


def _turn_costs(users: int) -> dict[str, float]:
    """Claim, decrypt, classify, decide and apply for `users` users of a SQLite store."""
    from lta_worker.domain import decide_turn
    from lta_worker.secret import Secret
    from lta_worker.simulator import DEMO_CLIENT_SECRET
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import long_term_credential

    reads = 2 * users
    out: dict[str, float] = {}
    with Workspace("b1-costs") as ws:
        settings = ws.settings("http://127.0.0.1:9", "http://127.0.0.1:9/auth")
        tokens = [(f"c-{i:07d}", "dspa_" + secrets.token_urlsafe(32)) for i in range(users)]
        bulk_store_tokens(settings, tokens)
        vault = Vault.from_settings(settings)
        secret = Secret(DEMO_CLIENT_SECRET)
        cfg, rng = settings.poll.policy(), random.Random(1)
        with Store.open(settings.database.url) as store:
            now = datetime.now(UTC)
            took, rows = _timed(lambda: _claim_all(store, now, users))
            out["store.claim_due (batches of 100)"] = _per(took, reads)

            def credentials() -> None:
                for row in rows:
                    long_term_credential(vault.decrypt(row.token, user=row.user), secret)

            out["vault.decrypt + credential"] = _per(_timed(credentials)[0], reads)
            took, outcomes = _classify_all(rows, now)
            out["classify"] = _per(took, reads)
            turns = list(zip(rows, outcomes, strict=True))
            took, updates = _timed(lambda: [decide_turn(r, o, now, cfg, rng) for r, o in turns])
            out["policy.decide_turn"] = _per(took, reads)
            took = _timed(lambda: _apply_all(store, updates))[0]
            out["store.apply, first results (inserts)"] = _per(took, reads)
            # The steady state: the same users claimed again (the first apply released
            # their leases and moved them an hour ahead), the same content read later.
            later = now + timedelta(hours=1)
            read = {r.id: o for r, o in turns}
            again_rows = _claim_all(store, later, users, due_before=later + timedelta(days=1))
            again = [decide_turn(r, read[r.id], later, cfg, rng) for r in again_rows]
            took = _timed(lambda: _apply_all(store, again))[0]
            out["store.apply, same content (updates)"] = _per(took, reads)
    return out


def _claim_all(
    store: Any, now: datetime, users: int, due_before: datetime | None = None
) -> list[Any]:
    rows: list[Any] = []
    for _ in range(users // 100 + 2):
        batch = store.claim_due(
            now=now,
            due_before=due_before or now,
            limit=100,
            owner="bench",
            lease_until=now + timedelta(minutes=5),
        )
        if not batch:
            break
        rows += batch
    return rows


def _classify_all(rows: list[Any], now: datetime) -> tuple[float, list[Any]]:
    """Classify two realistic answers per user; (seconds the classification took, outcomes)."""
    from lta_worker.domain import Answer, classify
    from lta_worker.simulator.state import latest_change, stats

    def answer(payload: Any) -> Any:
        return Answer(200, HEADERS, json.dumps(payload).encode(), elapsed=0.001)

    answers = [(answer(latest_change(r.user)), answer(stats(r.user))) for r in rows]
    t0 = time.perf_counter()
    outcomes = [
        (
            ("latest-change", classify("latest-change", a)),
            ("stats", classify("stats", b)),
        )
        for a, b in answers
    ]
    return time.perf_counter() - t0, outcomes


def _apply_all(store: Any, updates: list[Any]) -> None:
    for start in range(0, len(updates), 50):
        store.apply(updates[start : start + 50], owner="bench")


def _engine_alone(users: int) -> float:
    """Microseconds of CPU per read of a whole pass whose reads are answered from memory."""
    from lta_worker.domain import Answer
    from lta_worker.simulator.state import latest_change, stats

    with Workspace("b1-engine") as ws:
        settings = ws.settings("http://127.0.0.1:9", "http://127.0.0.1:9/auth")
        tokens = [(f"c-{i:07d}", "dspa_" + secrets.token_urlsafe(32)) for i in range(users)]
        bulk_store_tokens(settings, tokens)
        bodies = {
            token: {
                "latest-change": json.dumps(latest_change(user)).encode(),
                "stats": json.dumps(stats(user)).encode(),
            }
            for user, token in tokens
        }

        class Memory:
            """The `Reader` the engine needs, answering every read at once."""

            async def prove(self, proof: str) -> None:
                return None

            async def read(self, endpoint: str, token: Any) -> Any:
                await anyio.lowlevel.checkpoint()
                body = bodies[token.reveal()][endpoint]
                return Answer(200, HEADERS, body, elapsed=0.001)

        async def one_pass() -> float:
            from lta_worker.worker import Worker

            async with Worker(settings, kind="run") as worker:
                worker._api = Memory()  # type: ignore[assignment]
                cpu0 = cpu_seconds()
                result = await worker.run_pass()
                return (cpu_seconds() - cpu0) / max(result.reads, 1)

        per_read = []
        with quiet_logs("info"):
            for i in range(3):  # the first pass inserts the first results: not counted
                make_all_due(ws.db_path)
                cost = anyio.run(one_pass)
                if i:
                    per_read.append(cost)
    return round(1e6 * min(per_read), 1)


def _log_events(count: int) -> float:
    from lta_worker.logs import get_logger

    log = get_logger("lta_worker.engine")
    t0 = time.perf_counter()
    for i in range(count):
        log.info(
            "poll.read",
            user=f"c-{i:07d}",
            endpoint="stats",
            status=200,
            outcome="ok",
            code=None,
            reason=None,
            duration_ms=1.2,
            budget_remaining=999_999_000,
            budget_limit=1_000_000_000,
            budget_reset_s=3000.0,
        )
    return time.perf_counter() - t0


async def _pacer(count: int) -> float:
    from lta_worker.config import RateLimitSettings
    from lta_worker.pacing import Pacer, PacerCore

    pacer = Pacer(
        PacerCore(RateLimitSettings(reserve=0.1, fallback_per_hour=60.0), initial_burst=5),
        clock=time.monotonic,
        sleep=anyio.sleep,
        wall_clock=lambda: datetime.now(UTC),
    )
    t0 = time.perf_counter()
    for _ in range(count):
        permit = await pacer.acquire()
        pacer.feed(permit, HEADERS, 200, elapsed=0.0005)
        pacer.snapshot()
    return time.perf_counter() - t0


async def _sniffio(count: int) -> float:
    """What httpcore's `current_async_library()` costs (a failed import without sniffio).

    Called inside the event loop, as httpcore calls it: with sniffio installed it asks
    sniffio, which refuses to answer outside an async context.
    """
    from httpcore._synchronization import current_async_library

    t0 = time.perf_counter()
    for _ in range(count):
        current_async_library()
    return time.perf_counter() - t0


def sniffio_installed() -> bool:
    """True when `import sniffio` works (httpcore then finds it once and caches it)."""
    try:
        import sniffio  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":  # pragma: no cover - a quick look by hand
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for name, value in engine_costs().items():
        print(f"{value:>8} us  {name}")
