"""SIGTERM in the middle of a pass, for `run` and `serve`: gone within the grace period, nothing
half-written; `serve` exits 0, releases its leases and unregisters (between passes:
tests/service/test_serve.py)."""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest

from lta_worker.simulator import RunningSimulator
from support.process import Workspace, reads_seen, wait_for_reads

from .crash import acknowledge, deploy, inspect, rng, seed, violations

USERS = 16
STOPS_IN_CI = 5
GRACE_S = 0.5
# The stop may take the grace period, then closing the store and the HTTP client, then the
# interpreter's exit: this much more is allowed.
MARGIN_S = 3.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, running: RunningSimulator) -> Workspace:
    """16 users, every user due a second after a read; stalls outlive the grace period."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    made = deploy(
        tmp_path_factory.mktemp("sigterm"),
        running,
        service={"read_timeout": "5s"},
        poll={
            "interval": "1s",
            "backoff_base": "1s",
            "lease_duration": "1s",
            "tick": "1s",
            "concurrency": 4,
        },
        serve={"grace_period": f"{GRACE_S}s", "heartbeat": "1s"},
    )
    made.enroll([f"t{i:03d}" for i in range(USERS)])
    return made


def _stop_mid_pass(deployment: Workspace, command: str, offset: int, iterations: float) -> None:
    sim = deployment.sim
    chance = rng(offset)
    vault = deployment.vault()
    acknowledged: dict[tuple[str, str], datetime] = {}
    took: list[float] = []
    for stop in range(round(STOPS_IN_CI * iterations)):
        sim.clear_faults()
        sim.seed_faults(seed() + stop)
        sim.inject_fault("stall", rate=0.15, delay=30.0)
        sim.inject_fault("latency", rate=1.0, delay=0.15)
        acknowledge(acknowledged, inspect(deployment.database, integrity=False))
        before = reads_seen(sim)
        proc = deployment.spawn(command)
        assert wait_for_reads(sim, before), proc.stderr()[-3000:]
        time.sleep(chance.uniform(0.0, 0.5))
        acknowledge(acknowledged, inspect(deployment.database, integrity=False))
        signalled = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.wait(GRACE_S + MARGIN_S + 30)
        took.append(time.monotonic() - signalled)
        out = deployment.keep(proc)
        assert took[-1] <= GRACE_S + MARGIN_S, f"stop {stop}: {took[-1]:.2f}s"
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        seen = inspect(deployment.database)
        found = violations(seen, vault=vault, tokens=deployment.tokens, acknowledged=acknowledged)
        assert found == [], f"stop {stop}: {found}"
        assert all(r.state == "active" for r in seen.users.values())
        if command == "serve":
            assert code == 0, out.stderr[-3000:]
            assert "service.stopped" in out.event_names()
            leased = seen.leased_by(proc.process.pid)
            assert leased == [], f"stop {stop}: {leased} {_story(out.stderr)}"
            assert seen.instances_of(proc.process.pid) == []
        else:
            # `run` drains: 75 (stopped early, the rest stays due), or 0 when the signal
            # came as the pass was ending anyway; never killed by the signal itself.
            assert code in (0, 75), out.stderr[-3000:]
            assert "pass.finished" in out.event_names()
            assert seen.leased_by(proc.process.pid) == []
    sim.clear_faults()
    print(f"\nSIGTERM {command}: {len(took)} stops, slowest {max(took):.2f}s (grace {GRACE_S}s)")


def _story(stderr: str) -> str:
    """The log events of a stop, without the reads."""
    return "\n".join(line for line in stderr.splitlines() if '"poll.read"' not in line)


@pytest.mark.parametrize(("command", "offset"), [("run", 11), ("serve", 12)])
def test_sigterm_mid_pass(
    deployment: Workspace, iterations: float, command: str, offset: int
) -> None:
    """SIGTERM during a pass, 5 times: gone within the grace period, nothing half-written;
    `serve` exits 0 with its leases released and its instance unregistered."""
    _stop_mid_pass(deployment, command, offset, iterations)
