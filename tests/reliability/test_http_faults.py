"""HTTP faults (simulator and TCP fault proxy) under `lta-worker run`: it ends by itself (0 or
75) in bounded time, without a traceback or a retry storm, and every token is kept."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bench.faultproxy import FaultProxy

from lta_worker.simulator import RunningSimulator
from support.process import Output, Workspace, free_port, reads_seen

from .crash import deploy, inspect, seed, violations

USERS = 24
READ_TIMEOUT_S = 0.5
# A pass whose every read stalls for the whole timeout, eight at a time, stops after 20 of
# them, in about 1.5 s; anything near this bound is a hang.
RUN_BOUND_S = 20.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, running: RunningSimulator) -> Workspace:
    """24 users, a short read timeout, every user due again 0.3 s after a read."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    made = deploy(
        tmp_path_factory.mktemp("faults"),
        running,
        service={"read_timeout": f"{READ_TIMEOUT_S}s", "connect_timeout": "1s"},
        poll={
            "interval": "0.3s",
            "backoff_base": "0.2s",
            "lease_duration": "1s",
            "concurrency": 8,
        },
        # Before any RateLimit header (a new process whose reads all fail), the pacer sends
        # at this rate; the default (60/h) would stretch a failing pass over 20 minutes.
        ratelimit={"fallback_per_hour": 360_000},
    )
    made.enroll([f"f{i:03d}" for i in range(USERS)])
    return made


def _everyone_due(deployment: Workspace) -> None:
    """Wait (at most a few seconds) until every user is due again."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = datetime.now(UTC)
        rows = inspect(deployment.database, integrity=False).users.values()
        if all(r.next_due_at is not None and r.next_due_at <= now for r in rows):
            return
        time.sleep(0.1)
    raise AssertionError("users did not become due again")


def _run_through(
    deployment: Workspace, config: Path | None = None, *args: str
) -> tuple[Output, float]:
    _everyone_due(deployment)
    started = time.monotonic()
    out = deployment.cli("run", *args, config=config, timeout=RUN_BOUND_S + 30)
    return out, time.monotonic() - started


def _assert_survived(deployment: Workspace, out: Output, took: float) -> list[dict[str, object]]:
    """The common verdict: ended by itself, no crash, bounded, nothing deleted."""
    assert out.returncode in (0, 75), out.stderr[-3000:]
    assert took < RUN_BOUND_S, f"the run took {took:.1f}s"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    finished = [e for e in out.events if e.get("event") == "pass.finished"]
    assert len(finished) == 1, out.stderr[-3000:]
    assert finished[0]["stopped"] in ("completed", "upstream_down", "deadline")
    reads = [e for e in out.events if e.get("event") == "poll.read"]
    assert len(reads) <= 2 * USERS, f"{len(reads)} reads for {USERS} users"
    seen = inspect(deployment.database)
    assert violations(seen, vault=deployment.vault(), tokens=deployment.tokens) == []
    assert {r.state for r in seen.users.values()} == {"active"}
    return reads


SIM_FAULTS: Mapping[str, list[dict[str, object]]] = {
    "stall beyond the read timeout": [{"kind": "stall", "rate": 1.0, "delay": 30.0}],
    "dropped connection": [{"kind": "drop", "rate": 1.0}],
    "broken JSON": [{"kind": "broken_json", "rate": 1.0}],
    "503": [{"kind": "503", "rate": 1.0}],
    "a bit of everything": [
        {"kind": "stall", "rate": 0.1, "delay": 30.0},
        {"kind": "drop", "rate": 0.1},
        {"kind": "broken_json", "rate": 0.1},
        {"kind": "503", "rate": 0.1},
        {"kind": "latency", "rate": 0.3, "delay": 0.1},
    ],
}


@pytest.mark.parametrize("name", list(SIM_FAULTS))
def test_simulator_faults(deployment: Workspace, name: str) -> None:
    """Faults injected by the simulator: no crash, one read per endpoint at most, exit 0 or
    75, every token kept."""
    sim = deployment.sim
    sim.clear_faults()
    sim.seed_faults(seed())
    for rule in SIM_FAULTS[name]:
        sim.inject_fault(**rule)  # type: ignore[arg-type]
    before = reads_seen(sim)
    try:
        out, took = _run_through(deployment)
    finally:
        sim.clear_faults()
    reads = _assert_survived(deployment, out, took)
    assert reads_seen(sim) - before == len(reads)
    if all(rule["rate"] == 1.0 for rule in SIM_FAULTS[name]):
        assert {e["outcome"] for e in reads} == {"transient"}
        assert out.returncode == 75  # 20 failures in a row: the service looks down


@pytest.fixture
def proxy_for(deployment: Workspace) -> Iterator[object]:
    """Start a fault proxy in front of the simulator; stopped after the test."""
    started: list[FaultProxy] = []

    def start(fates: Mapping[str, float]) -> FaultProxy:
        target = (deployment.running.host, deployment.running.port)
        proxy = FaultProxy(target, fates, seed()).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


PROXY_FATES: Mapping[str, Mapping[str, float]] = {
    "reset": {"reset": 1.0},
    "closed without an answer": {"close": 1.0},
    "truncated body": {"truncate": 1.0},
    "stall": {"stall": 1.0},
    "garbage": {"garbage": 1.0},
    "mixed": {
        "pass": 0.4,
        "reset": 0.1,
        "close": 0.1,
        "truncate": 0.1,
        "stall": 0.1,
        "garbage": 0.1,
        "slow": 0.1,
    },
}


@pytest.mark.parametrize("name", list(PROXY_FATES))
def test_proxy_faults(deployment: Workspace, proxy_for: object, name: str) -> None:
    """TCP-level faults from the fault proxy: no crash, bounded connections and reads, exit 0
    or 75, every token kept."""
    proxy = proxy_for(PROXY_FATES[name])  # type: ignore[operator]
    config = deployment.other_config(
        deployment.tmp / f"proxy-{name.replace(' ', '-')}.toml", service={"base_url": proxy.url}
    )
    out, took = _run_through(deployment, config)
    reads = _assert_survived(deployment, out, took)
    connections = sum(proxy.seen.values())
    assert connections <= len(reads) + 4, f"{connections} connections for {len(reads)} reads"
    if "pass" not in PROXY_FATES[name] and "slow" not in PROXY_FATES[name]:
        assert {e["outcome"] for e in reads} == {"transient"}
        assert out.returncode == 75
    else:
        assert {"ok", "transient"} <= {e["outcome"] for e in reads}


def test_unreachable_with_default_pacing_stops_after_the_first_burst(
    deployment: Workspace,
) -> None:
    """Nothing listens at service.base_url (default fallback rate): `run` sends the initial
    burst and stops as upstream_down (75) at once, every token kept."""
    config = deployment.other_config(
        deployment.tmp / "refused-default.toml",
        service={"base_url": f"http://127.0.0.1:{free_port()}"},
        ratelimit={"fallback_per_hour": 60},
    )
    out, took = _run_through(deployment, config, "--max-duration", "1h")
    reads = _assert_survived(deployment, out, took)
    assert out.returncode == 75
    assert took < 10  # start, the burst, the grace period for reads in flight, exit
    # poll.breaker_threshold (5) permits at once; five failures with nothing accepted stop it.
    assert 1 <= len(reads) <= 6, len(reads)
    assert {e["outcome"] for e in reads} == {"transient"}
    finished = [e for e in out.events if e.get("event") == "pass.finished"]
    assert finished[0]["stopped"] == "upstream_down"


def test_clean_run_after_the_faults(deployment: Workspace) -> None:
    """After every fault above, a run without faults exits 0 and reads every user (with a
    lease long enough that a busy machine's slow renewal gives up no turn)."""
    deployment.sim.clear_faults()
    config = deployment.other_config(deployment.tmp / "clean.toml", poll={"lease_duration": "30s"})
    out, took = _run_through(deployment, config)
    reads = _assert_survived(deployment, out, took)
    assert out.returncode == 0
    assert {e["user"] for e in reads if e["outcome"] == "ok"} == set(deployment.tokens)
