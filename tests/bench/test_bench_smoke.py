"""`bench/run --smoke` still runs and reports every figure: B6's short soak (invariants at any
size) by default, every benchmark with `LTA_BENCH_SMOKE=all` (run it when bench/ or a face it
drives changes)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
# B3PG and B6 measure PostgreSQL on the test server when there is one, else report skipped.
PG_URL = os.environ.get("LTA_TEST_DATABASE_URL")
NEEDS_PG = ("B3PG", "B6")
# Every benchmark with LTA_BENCH_SMOKE=all; else B6's invariants only (the CI minutes go elsewhere).
ALL = os.environ.get("LTA_BENCH_SMOKE") == "all"
# Counts whose right value is 0 (429s, doubles, exits); every other figure is positive.
ZERO_IS_RIGHT = (
    "429 answers",
    "429s",
    "doubles",
    "exits",
    "still",
    "not ",
    "unlike",
    "missing",
    "out of order",
    "left in",
    "written after",
    "due later",
)
# The headline figures of each benchmark (names are stable: the README and results use them).
EXPECTED = {
    "B1": (
        "baseline_time / worker_time",
        "worker reads/s",
        "baseline reads/s",
        "ApiClient-only reads/s",
        "worker CPU per read",
        "ratio, simulator on a thread",
        "ratio with sniffio importable",
    ),
    "B2": (
        "reads per window / (budget - reserve)",
        "worst window",
        "429 answers in the pass",
        "hour windows: worst window",
        "hour windows: 429 answers",
    ),
    "B3": ("claim_due of 100 users", "status (collect_status)", "peak RSS ratio, 2x the users"),
    "B3PG": (
        "claim_due of 100 users out of 2,000",
        "status (collect_status), 2,000 users",
        "fleet of 1, reads/s (unlimited budget)",
        "fleet of 2, scaling ratio to one instance",
        "fleet of 4, scaling ratio to one instance",
    ),
    "B4": ("run, nothing due (wall)", "status (wall)", "python -c pass"),
    # B6's figures are its invariants: `test_the_soak_holds_every_invariant` judges them.
    "B6": (
        "doubles (two instances, one lease)",
        "429s earned by the fleet",
        "revoked users still holding a token",
        "re-enrolled users not active",
        "drops not as their command said",
        "rows of forgotten users written after forget",
        "webhooks missing (state changes)",
        "webhooks out of order per user",
        "webhooks left in the outbox",
        "exits (on a survivable fault)",
        "stored results unlike what was served",
        "instances not reloaded on SIGHUP",
        "users due later than the new interval",
        "reads after the last fault",
        "reads by the instance with a stepped clock",
        "results checked against the simulator",
        "webhooks received",
        "429s injected (other traffic)",
        "503s injected",
    ),
    "B5": tuple(
        f"{population}{budget}/h per 400: mean delay, {who}"
        for population in ("", "waking: ", "sessions: ")
        for budget in (100, 200, 400)
        for who in ("worker / round robin", "round robin", "worker", "worker / oracle")
        + (("learner told the population's model / oracle",) if population != "sessions: " else ())
    ),
    "B7": (
        "delay to the receiver, median (interval 500ms)",
        "delay to the receiver, p95 (interval 500ms)",
        "apply with events / without",
    ),
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `bench/run --smoke` (B6's short soak on PostgreSQL, about 2 minutes; every
    benchmark with LTA_BENCH_SMOKE=all, 30 s more), its JSON results."""
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    only = [] if ALL else ["--only", "B6"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    env.pop("LTA_BENCH_DATABASE_URL", None)
    if PG_URL:
        env["LTA_BENCH_DATABASE_URL"] = PG_URL
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run"), "--smoke", *only, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    data["stdout"] = proc.stdout
    return data


def _figures(data: dict[str, Any], bench: str) -> dict[str, Any]:
    return {f["name"]: f for f in data["benchmarks"][bench]["figures"]}


def _every_benchmark() -> None:
    if not ALL:
        pytest.skip("every benchmark's smoke runs with LTA_BENCH_SMOKE=all; CI runs B6's only")


def test_every_benchmark_ran(smoke: dict[str, Any]) -> None:
    """B1 to B5 and B7 each ran to its end (none reported `failed`) in the smoke size."""
    _every_benchmark()
    assert smoke["size"] == "smoke"
    assert set(smoke["benchmarks"]) == set(EXPECTED)
    for bench, result in smoke["benchmarks"].items():
        assert "error" not in _figures(smoke, bench), (bench, result["figures"])


@pytest.mark.parametrize("bench", sorted(EXPECTED))
def test_each_benchmark_reports_its_figures(smoke: dict[str, Any], bench: str) -> None:
    """Each headline figure is there, as a finite positive number (a ratio, a time, a count)."""
    if bench != "B6":
        _every_benchmark()
    if bench in NEEDS_PG and not PG_URL:
        pytest.skip(f"{bench} needs LTA_TEST_DATABASE_URL (without it, it reports itself skipped)")
    figures = _figures(smoke, bench)
    for name in EXPECTED[bench]:
        assert name in figures, (bench, name, sorted(figures))
        value = figures[name]["value"]
        assert isinstance(value, int | float), (name, value)
        assert math.isfinite(value) and value >= 0, (name, value)
        if not any(zero in name for zero in ZERO_IS_RIGHT):
            assert value > 0, (name, value)


def test_the_work_was_done(smoke: dict[str, Any]) -> None:
    """The passes read what they were given: every B1 pass made its 2 reads per user, all ok."""
    _every_benchmark()
    b1 = smoke["benchmarks"]["B1"]["details"]
    reads = b1["reads_per_pass"]
    expected = {"worker": {"ok": reads}, "api_client": {"200": reads}, "baseline": {"200": reads}}
    for variant, statuses in expected.items():
        for row in b1["simulator_in_child_process"][variant]["rounds"]:
            assert (row["reads"], row["statuses"]) == (reads, statuses), variant
    memory = smoke["benchmarks"]["B3"]["details"]["memory"]["sizes"]
    assert [size["reads"] for size in memory] == [size["users"] for size in memory]


def test_b5_holds_every_policy_per_workload_and_budget(smoke: dict[str, Any]) -> None:
    """results.json holds B5's four policies for each population at each budget, per class."""
    _every_benchmark()
    workloads = smoke["benchmarks"]["B5"]["workloads"]
    assert set(workloads) == {"builtin", "waking", "sessions"}
    for workload in workloads.values():
        assert set(workload["budgets"]) == {"100", "200", "400", "800"}
        for figures in workload["budgets"].values():
            for policy in ("worker", "round_robin", "round_robin_on_change", "oracle"):
                assert figures[policy]["mean_delay_h"] > 0, policy
                assert figures[policy]["budget_used"] > 0.9, policy
                assert figures[policy]["classes"], policy


DOUBLES = "doubles (two instances, one lease)"


def test_the_soak_holds_every_invariant(smoke: dict[str, Any]) -> None:
    """B6's short soak held every invariant, and each of its faults was seen to happen."""
    if not PG_URL:
        pytest.skip("B6 needs LTA_TEST_DATABASE_URL (without it, it reports itself skipped)")
    details = smoke["benchmarks"]["B6"]["details"]
    broken = {name: f for name, f in details["invariants"].items() if not f["held"]}
    assert len(details["faults"]) == 16
    assert details["invariants"][DOUBLES]["value"] == 0, details["doubles"][:5]
    assert not broken, (broken, details["faults"], details["warnings_and_errors"])


def test_a_smoke_run_judges_no_target(smoke: dict[str, Any]) -> None:
    """Tiny sizes say nothing about the targets: no figure is marked met or missed."""
    for result in smoke["benchmarks"].values():
        assert all(f["met"] is None and f["target"] == "" for f in result["figures"])
    assert "targets: 0 met, 0 missed" in smoke["stdout"]


def test_without_a_server_it_says_it_was_skipped_and_why(tmp_path: Path) -> None:
    """Without a PostgreSQL URL, B3PG and B6 run nothing and report `skipped` and how to run."""
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    env.pop("LTA_BENCH_DATABASE_URL", None)
    args = ["--smoke", "--only", ",".join(NEEDS_PG), "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    for bench in NEEDS_PG:
        figures = _figures(results, bench)
        assert list(figures) == ["skipped"], bench
        assert "LTA_BENCH_DATABASE_URL" in figures["skipped"]["note"]
        assert "--database-url" in figures["skipped"]["note"]
