"""Lifecycle commands win over a running pass (issue 11, cases 1, 2, 4 and 6): a gate in the
HTTP transport holds the pass after a read returned, so a command runs between the pass's
claim and its write, deterministically, on SQLite and PostgreSQL (row locks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from lta_worker.cli._users_cmd import _report
from lta_worker.enrollment import DropResult
from lta_worker.errors import LtaError, StorageError
from lta_worker.report import iso
from lta_worker.simulator import SimulatorTransport
from lta_worker.storage import Store
from lta_worker.storage._db import Database
from lta_worker.worker import PassResult

from .conftest import ON_BOTH_BACKENDS, Gate, Harness

pytestmark = [pytest.mark.anyio, ON_BOTH_BACKENDS]

HOUR = timedelta(hours=1)


async def gated_pass(harness: Harness, during: Any) -> tuple[PassResult, list[dict[str, Any]]]:
    """Run a pass, and `await during()` while its first read is held after returning."""
    gate = Gate(SimulatorTransport(harness.sim))
    worker = harness.worker(gate)
    box: dict[str, PassResult] = {}
    with capture_logs() as logs:
        async with worker:

            async def run() -> None:
                box["result"] = await worker.run_pass()

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await gate.reached.wait()
                await during()
                gate.release.set()
    return box["result"], logs


def results_of(harness: Harness, user: str) -> list[Any]:
    with harness.store() as store:
        return list(store.export_results(user))


@pytest.mark.parametrize("command", ["drop", "forget"])
async def test_drop_or_forget_during_a_pass_is_not_undone(harness: Harness, command: str) -> None:
    """Case 1: a user dropped or forgotten while a pass holds it stays so; nothing written back."""
    await harness.enroll("x")
    await harness.run_pass()
    assert results_of(harness, "x")
    harness.advance(HOUR + timedelta(seconds=1))
    harness.sim.set_payload("x", "stats", {"v": "new"})

    async def during() -> None:
        async with harness.lifecycle() as lc:
            await (lc.forget("x") if command == "forget" else lc.drop("x"))

    result, logs = await gated_pass(harness, during)
    row = harness.user("x")
    assert (row.state, row.token) == ("dropped", None)
    stored = results_of(harness, "x")
    if command == "forget":
        assert stored == []
        with harness.store() as store:
            assert store.history("x", "stats") == []
    else:
        assert all(r.payload != {"v": "new"} for r in stored)
    assert result.exit_code == 0
    discarded = [e for e in logs if e["event"] == "poll.discarded"]
    assert [(e["user"], e["reason"]) for e in discarded] == [("x", "changed")]


async def test_reenrollment_during_a_pass_keeps_the_new_token(harness: Harness) -> None:
    """Case 2: a revocation seen with the old token never deletes the token enrolled since."""
    await harness.enroll("x")
    await harness.run_pass()
    harness.advance(HOUR + timedelta(seconds=1))
    harness.sim.revoke("x")

    async def during() -> None:
        # Due after the pass started, the new enrollment is not claimed by it (due exactly at
        # its start, a race decided whether this pass read the new token itself).
        harness.advance(timedelta(seconds=1))
        await harness.enroll("x", create=False)

    result, logs = await gated_pass(harness, during)
    assert result.counts == {"revoked": 1}, "the new token waits for the next pass"
    row = harness.user("x")
    assert row.state == "active"
    assert row.token is not None
    grants = harness.sim.user_info("x")["connected_services"]
    assert sorted(g["state"] for g in grants) == ["active", "revoked"]
    assert any(e["event"] == "poll.discarded" and e["user"] == "x" for e in logs)
    # The discarded decision (revoked, token deleted) is not logged as if it happened.
    told = [e["event"] for e in logs if e.get("user") == "x"]
    assert "user.state_changed" not in told and "token.deleted" not in told, told
    # The new token still reads.
    harness.advance(timedelta(seconds=1))
    again = await harness.run_pass()
    assert again.counts["ok"] == 2


def stored_when_logged(harness: Harness, user: str) -> Any:
    """A log processor that notes, in each state or token event, the row stored by then."""

    def probe(_logger: Any, _method: str, event: Any) -> Any:
        if event["event"] in {"user.state_changed", "token.deleted"}:
            row = harness.user(user)
            event["stored"] = (row.state, row.token is not None)
        return event

    return probe


async def test_state_and_token_events_of_an_applied_decision_follow_its_commit(
    harness: Harness,
) -> None:
    """`user.state_changed` and `token.deleted` are logged once the revocation is stored."""
    await harness.enroll("x")
    await harness.run_pass()
    harness.advance(HOUR + timedelta(seconds=1))
    harness.sim.revoke("x")
    with capture_logs(processors=[stored_when_logged(harness, "x")]) as logs:
        result = await harness.run_pass()
    assert result.counts == {"revoked": 1}
    told = [(e["event"], e["stored"]) for e in logs if "stored" in e]
    assert told == [
        ("user.state_changed", ("revoked", False)),
        ("token.deleted", ("revoked", False)),
    ]
    assert [e["log_level"] for e in logs if e["event"] == "token.deleted"] == ["warning"]


@pytest.mark.parametrize("users", [6, 1])  # above poll.breaker_threshold, below it
async def test_a_pass_of_only_404s_changes_nothing_and_exits_78(
    harness: Harness, users: int
) -> None:
    """Case 4: a wrong base URL (every answer 404) keeps every stored result; exit 78, hint."""
    for n in range(users):
        await harness.enroll(f"u{n}")
    await harness.run_pass()
    before = {n: results_of(harness, f"u{n}") for n in range(users)}
    harness.advance(HOUR + timedelta(seconds=1))
    harness.configure("service", base_url="https://api.sim.example/wrong-prefix")
    with capture_logs() as logs:
        result = await harness.run_pass()
    assert (result.stopped, result.exit_code) == ("breaker", 78)
    assert result.reads <= 5
    for n in range(users):
        assert results_of(harness, f"u{n}") == before[n]
        row = harness.user(f"u{n}")
        assert (row.state, row.consecutive_failures) == ("active", 0)
    tripped = [e for e in logs if e["event"] == "pass.breaker_tripped"]
    assert tripped and "service.base_url" in tripped[0]["hint"]


async def test_a_404_on_stats_never_replaces_a_stored_result(harness: Harness) -> None:
    """Case 4: among good answers, a 404 on stats is a transient failure, not `none`."""
    await harness.enroll("good")
    await harness.enroll("odd")
    await harness.run_pass()
    harness.advance(HOUR + timedelta(seconds=1))
    inner = SimulatorTransport(harness.sim)

    async def handler(request: httpx.Request) -> httpx.Response:
        response = await inner.handle_async_request(request)
        if request.url.path.endswith("/stats") and harness.sim.requests()[-1].user == "odd":
            return httpx.Response(404)
        return response

    async with harness.worker(httpx.MockTransport(handler)) as worker:
        result = await worker.run_pass()
    assert result.exit_code == 0
    stats = {r.endpoint: r for r in results_of(harness, "odd")}["stats"]
    assert stats.status == "ok"
    row = harness.user("odd")
    assert (row.last_outcome, row.consecutive_failures) == ("transient", 1)


async def down(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


def deletes(harness: Harness) -> list[Any]:
    """The DELETEs of long term tokens the simulator received."""
    return [e for e in harness.sim.requests() if e.method == "DELETE"]


async def held_drop(
    harness: Harness, during: Any, inner: httpx.AsyncBaseTransport | None = None
) -> DropResult:
    """`users drop x` whose DELETE is held while `await during()` runs, then let through."""
    gate = Gate(inner or SimulatorTransport(harness.sim), delete=True)
    box: dict[str, DropResult] = {}
    async with harness.lifecycle(gate) as lc:

        async def drop() -> None:
            box["result"] = await lc.drop("x")

        async with anyio.create_task_group() as tg:
            tg.start_soon(drop)
            await gate.reached.wait()
            await during()
            gate.release.set()
    return box["result"]


def deletes_answered(harness: Harness, answer: int) -> httpx.MockTransport:
    """The simulator, whose DELETEs (seen by it) answer `answer` instead of 204."""
    real = SimulatorTransport(harness.sim)

    async def answering(request: httpx.Request) -> httpx.Response:
        response = await real.handle_async_request(request)
        if request.method == "DELETE" and answer != 204:
            return httpx.Response(answer)
        return response

    return httpx.MockTransport(answering)


def reported(result: DropResult, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """What `users drop` prints for `result` (its line or its error) and its exit code."""
    try:
        code = _report(result, "dropped")
    except LtaError as error:
        return error.exit_code, error.message
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("answer", [204, 503])
async def test_a_pass_during_a_drop_sends_no_second_delete(
    harness: Harness, capsys: pytest.CaptureFixture[str], answer: int
) -> None:
    """While `users drop` waits for its DELETE a pass sends none; it prints what was stored."""
    await harness.enroll("x")
    await harness.run_pass()
    assert harness.user("x").last_outcome == "ok"
    passes: list[PassResult] = []

    async def during() -> None:
        passes.append(await harness.run_pass())

    result = await held_drop(harness, during, deletes_answered(harness, answer))
    assert passes[0].reads == 0
    assert len(deletes(harness)) == 1
    row = harness.user("x")
    code, said = reported(result, capsys)
    if answer == 204:
        assert (row.state, row.token, row.last_outcome) == ("dropped", None, "dropped")
        assert code == 0 and "dropped 'x'" in said and "local token deleted" in said
        return
    assert (row.state, row.last_outcome) == ("dropping", "drop_failed")
    assert row.token is not None and row.next_due_at == result.retry_at
    assert code == 75 and f"(next at {iso(row.next_due_at)})" in said, said


async def test_a_pass_retries_a_pending_drop_and_a_drop_meanwhile_sends_none(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pass retries a pending drop once due (never reading it); a `users drop` while that
    DELETE is out sends no second one, and says so."""
    await harness.enroll("x")
    async with harness.lifecycle(httpx.MockTransport(down)) as lc:
        pending = await lc.drop("x")
    assert pending.state == "dropping" and pending.retry_at is not None
    harness.advance(pending.retry_at - harness.clock.now() + timedelta(seconds=1))
    gate = Gate(SimulatorTransport(harness.sim), delete=True)
    box: dict[str, Any] = {}

    async def run() -> None:
        box["pass"] = await worker.run_pass()

    with capture_logs() as logs:
        async with harness.worker(gate) as worker, anyio.create_task_group() as tg:
            tg.start_soon(run)
            await gate.reached.wait()
            async with harness.lifecycle() as lc:
                box["drop"] = await lc.drop("x")
            gate.release.set()
    assert box["pass"].reads == 0
    assert len(deletes(harness)) == 1
    row = harness.user("x")
    assert (row.state, row.token) == ("dropped", None)
    drops = [e["event"] for e in logs if e["event"].startswith("drop.")]
    assert drops == ["drop.retried", "drop.confirmed"]
    code, said = reported(box["drop"], capsys)
    assert code == 75 and "already" in said, said


@pytest.mark.parametrize("answer", [204, 503])
async def test_a_reenrollment_during_a_drop_is_reported_as_overtaking_it(
    harness: Harness, capsys: pytest.CaptureFixture[str], answer: int
) -> None:
    """A new consent while the DELETE is out wins; `users drop` says it was overtaken (75)."""
    await harness.enroll("x")
    await harness.run_pass()

    async def during() -> None:
        harness.advance(timedelta(seconds=1))
        await harness.enroll("x", create=False)

    result = await held_drop(harness, during, deletes_answered(harness, answer))
    row = harness.user("x")
    assert (row.state, row.token is not None) == ("active", True)
    code, said = reported(result, capsys)
    assert code == 75, said
    assert "overtaken by a new consent" in said and "active" in said
    assert "local token deleted" not in said and "next at" not in said


async def test_a_forget_cut_off_by_the_database_never_leaves_results_of_a_dropping_user(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget cut after its first commit leaves no result of the `dropping` user (issue 28)."""
    await harness.enroll("x")
    await harness.run_pass()
    assert results_of(harness, "x")
    original = Database.write
    committed: list[bool] = []

    @contextmanager
    def cut_after_one_commit(self: Database, **kwargs: Any) -> Iterator[Any]:
        if committed:
            raise StorageError("the database went away (connection cut)")
        with original(self, **kwargs) as conn:
            yield conn
        committed.append(True)

    async with harness.lifecycle() as lc:
        monkeypatch.setattr(Database, "write", cut_after_one_commit)
        with pytest.raises(StorageError):
            await lc.forget("x")
        monkeypatch.undo()
    row = harness.user("x")
    assert row.state == "dropping" and row.token is not None
    assert results_of(harness, "x") == []
    with harness.store() as store:
        assert store.history("x", "stats") == []


async def test_a_pass_reads_no_more_for_a_user_a_drop_took_once_a_renewal_returned(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drop between a turn's two reads: once a renewal returned, no more reads (issue 28)."""
    harness.configure("poll", lease_duration="3s")
    await harness.enroll("x")
    renewed = threading.Event()
    original = Store.renew_leases

    def renew(self: Store, *args: Any, **kwargs: Any) -> int:
        out = original(self, *args, **kwargs)
        renewed.set()
        return out

    monkeypatch.setattr(Store, "renew_leases", renew)

    async def during() -> None:
        async with harness.lifecycle() as lc:
            await lc.drop("x")
        for _ in range(2):  # the second ran whole after the drop's commit
            renewed.clear()
            assert await anyio.to_thread.run_sync(renewed.wait, 10)

    _result, logs = await gated_pass(harness, during)
    read = [e["endpoint"] for e in logs if e["event"] == "poll.read" and e.get("user") == "x"]
    assert read == ["latest-change"]
    assert ("x", "changed") in [(e.get("user"), e.get("reason")) for e in logs]
    assert harness.user("x").state == "dropped"
