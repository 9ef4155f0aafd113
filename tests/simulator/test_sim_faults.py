"""Injected faults on the reads: each kind, next-N and rate rules, and seed reproducibility."""

from __future__ import annotations

import anyio
import httpx
import pytest

from lta_worker.simulator import ControlError, ManualClock, Simulator, SimulatorTransport
from lta_worker.simulator.responses import FaultPlan

from .helpers import BASE, LATEST, STATS, Flow, bearer

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("kind", "status", "content_type"),
    [("500", 500, "application/json"), ("502", 502, "text/html"), ("503", 503, "text/plain")],
)
async def test_server_error_faults(flow: Flow, kind: str, status: int, content_type: str) -> None:
    """A 5xx fault replaces the next read's answer, then reads succeed again."""
    credential = await flow.enrolled()
    flow.sim.inject_fault(kind, count=1)
    faulted = await flow.http.get(STATS, headers=bearer(credential))
    after = await flow.http.get(STATS, headers=bearer(credential))
    assert faulted.status_code == status
    assert faulted.headers["content-type"].startswith(content_type)
    assert "ratelimit" in faulted.headers
    assert after.status_code == 200


async def test_drop_fault_is_a_remote_protocol_error(flow: Flow) -> None:
    """A dropped connection reaches an in-process client as httpx.RemoteProtocolError."""
    credential = await flow.enrolled()
    flow.sim.inject_fault("drop", count=2)
    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            await flow.http.get(STATS, headers=bearer(credential))
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200


async def test_drop_fault_when_streaming_fails_while_reading_the_body(flow: Flow) -> None:
    """Streamed, a drop shows a 200 status line whose body then fails, as over a socket."""
    credential = await flow.enrolled()
    flow.sim.inject_fault("drop", count=1)
    async with flow.http.stream("GET", STATS, headers=bearer(credential)) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await response.aread()


async def test_broken_json_fault_is_a_200_that_does_not_parse(flow: Flow) -> None:
    """broken_json answers 200 with a JSON body cut short."""
    credential = await flow.enrolled()
    flow.sim.inject_fault("broken_json", count=1)
    response = await flow.http.get(LATEST, headers=bearer(credential))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(ValueError, match=r"Expecting|Unterminated|delimiter"):
        response.json()


async def test_latency_fault_waits_then_answers(clock: ManualClock) -> None:
    """A latency fault sleeps its delay (through the injected sleep) before the real answer."""
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    sim = Simulator(clock=clock, sleep=fake_sleep)
    sim.add_user("alice")
    sim.inject_fault("latency", count=1, delay=0.25)
    async with httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as http:
        response = await http.get(STATS, headers=bearer("dspa_x.y"))
    assert slept == [0.25]
    assert response.status_code == 401


async def test_stall_fault_outlasts_a_client_timeout_and_is_cancellable(
    clock: ManualClock,
) -> None:
    """A stall waits an hour by default; a client giving up cancels it cleanly."""
    stalled = anyio.Event()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        stalled.set()
        await anyio.sleep(seconds)

    sim = Simulator(clock=clock, sleep=sleep)
    sim.inject_fault("stall", count=1)
    async with (
        httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as http,
        anyio.create_task_group() as tasks,
    ):
        tasks.start_soon(http.get, STATS)
        await stalled.wait()
        tasks.cancel_scope.cancel()
    assert slept == [3600]
    async with httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as http:
        assert (await http.get(STATS)).status_code == 401


async def test_fault_is_logged_with_what_the_client_saw(flow: Flow) -> None:
    """The request log marks a faulted read with the fault and the status the client got."""
    credential = await flow.enrolled()
    flow.sim.clear_requests()
    flow.sim.inject_fault("503", count=1)
    flow.sim.inject_fault("drop", count=1)
    await flow.http.get(STATS, headers=bearer(credential))
    with pytest.raises(httpx.RemoteProtocolError):
        await flow.http.get(STATS, headers=bearer(credential))
    seen = [(e.status, e.fault) for e in flow.sim.requests()]
    assert seen == [(503, "503"), (None, "drop")]


def test_rate_faults_are_reproducible_from_the_seed() -> None:
    """The same seed and the same reads give the same faults; another seed differs."""

    def run(seed: int) -> list[str | None]:
        plan = FaultPlan(seed)
        plan.add("500", rate=0.3)
        plan.add("drop", rate=0.2)
        return [(rule.kind if (rule := plan.draw()) else None) for _ in range(200)]

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    assert 30 < first.count("500") < 90
    assert "drop" in first


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "teapot", "count": 1},
        {"kind": "500"},
        {"kind": "500", "rate": 0.5, "count": 1},
        {"kind": "500", "rate": 1.5},
        {"kind": "500", "count": 0},
        {"kind": "latency", "count": 1, "delay": -1},
    ],
)
def test_bad_fault_rules_are_refused(sim: Simulator, kwargs: dict[str, object]) -> None:
    """Unknown kinds, missing or double triggers and out-of-range values are refused."""
    with pytest.raises(ControlError):
        sim.inject_fault(**kwargs)  # type: ignore[arg-type]
