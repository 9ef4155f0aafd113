"""`lta-worker status` after a real `run` against the served simulator, as JSON and a table."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lta_worker import __version__
from lta_worker.domain import BudgetSeen, PassRecord
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET
from support.process import Workspace

BUDGET = 100_000


@pytest.fixture
def after_a_pass(world: Workspace) -> Workspace:
    """Five users (three active, one parked, one unlinked) after one `run` (stderr no tty)."""
    world.enroll(
        {
            "ada": {},
            "bob": {},
            "cy": {},
            "hedy": {"last_sync_age_days": 120},
            "claude": {"linked": False},
        }
    )
    done = world.here("run")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "\r" not in done.stderr  # no progress line when stderr is not a terminal
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert events[-1]["event"] == "pass.finished"
    assert DEMO_CLIENT_SECRET not in done.stderr
    return world


def status(world: Workspace) -> dict[str, Any]:
    done = world.here("status", "--format", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_status_json_after_a_pass(after_a_pass: Workspace) -> None:
    """Users per state, nobody due, the last pass with its counts, the budget the simulator
    reported, a sustainable plan, healthy; `generated_at` (now), `version`, `last_success`."""
    data = status(after_a_pass)
    assert data["users"] == {
        "active": 3,
        "parked": 1,
        "unlinked": 1,
        "rejected": 0,
        "revoked": 0,
        "dropping": 0,
        "dropped": 0,
    }
    assert data["due"] == 0
    last = data["last_pass"]
    assert (last["stopped"], last["exit_code"], last["reads"], last["throttled"]) == (
        "completed",
        0,
        8,
        0,
    )
    assert {k: v for k, v in last["counts"].items() if v} == {"ok": 6, "inactive": 1, "unlinked": 1}
    assert datetime.fromisoformat(last["finished_at"]) <= datetime.now(UTC)
    budget = data["budget"]
    assert (budget["limit"], budget["window_seconds"]) == (BUDGET, 3600)
    # The last answer's figure: concurrent reads may be answered out of order.
    assert BUDGET - 8 <= budget["remaining"] < BUDGET
    assert datetime.fromisoformat(budget["reset_at"]) > datetime.now(UTC)
    capacity = data["capacity"]
    # 3 active users x 2 reads per hour, and 2 re-checks a day.
    assert capacity["reads_needed_per_hour"] == pytest.approx(6.1)
    assert capacity["available_per_hour"] == pytest.approx(BUDGET * 0.9)
    assert capacity["budget_known"] is True
    assert capacity["configured_interval_s"] == 3600
    assert capacity["effective_interval_s"] == 3600
    assert capacity["sustainable"] is True
    assert capacity["warning"] is None
    assert data["instances"] == []  # `run` unregistered itself on exit
    generated = datetime.fromisoformat(data["generated_at"])
    assert abs(datetime.now(UTC) - generated) < timedelta(minutes=1)
    assert data["version"] == __version__
    assert data["last_success"] == data["last_pass"]
    assert (data["healthy"], data["problems"]) == (True, [])


def test_status_table_after_a_pass(after_a_pass: Workspace) -> None:
    """The table says the same for people: states, the last pass, the budget, the plan."""
    done = after_a_pass.here("status")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    lines = [line.split() for line in text.splitlines()]
    for state, count in (("active", "3"), ("parked", "1"), ("unlinked", "1"), ("revoked", "0")):
        assert [state, count] in lines
    assert ["due", "now", "0"] in lines
    assert "completed (exit 0)" in text
    assert "8 reads, 0 throttled; inactive 1, ok 6, unlinked 1" in text
    assert re.search(rf"\b9999\d of {BUDGET} left, window 3600 s", text)
    assert "each user read every 1h" in text
    assert "WARNING" not in text


def test_status_warns_when_the_budget_cannot_sustain_the_interval(after_a_pass: Workspace) -> None:
    """120 requests an hour less 10% cannot read 3 users twice every 2 minutes (180 reads an
    hour): the plan stretches the interval to 3m20s and says what to do."""
    world = after_a_pass
    world.configure(poll={"interval": "2m"})
    now = datetime.now(UTC)
    with world.store() as store:
        seen = BudgetSeen(120, 100, now + timedelta(minutes=30), 3600.0, now + timedelta(seconds=1))
        store.record_budget(DEMO_CLIENT_ID, seen)
    capacity = status(world)["capacity"]
    assert capacity["reads_needed_per_hour"] == pytest.approx(180.1)
    assert capacity["available_per_hour"] == pytest.approx(108)
    assert capacity["sustainable"] is False
    assert capacity["effective_interval_s"] == 200
    assert "raise poll.interval or ask for a larger budget" in capacity["warning"]
    table = world.here("status").stdout
    assert "WARNING: the budget allows about 108 reads/h" in table
    assert "each user read every 3m20s" in table


def test_status_before_any_pass(world: Workspace) -> None:
    """A fresh database: users due now, no pass yet, no budget seen, the fallback rate used."""
    world.enroll(["ada"])
    data = status(world)
    assert data["users"]["active"] == 1
    assert data["due"] == 1
    assert data["last_pass"] is None
    assert data["budget"] is None
    assert data["capacity"]["budget_known"] is False
    assert data["capacity"]["available_per_hour"] == 60
    table = world.here("status").stdout
    assert "none yet" in table
    assert "(fallback rate)" in table


def test_status_after_a_breaker_is_unhealthy(after_a_pass: Workspace) -> None:
    """A last pass stopped at the breaker: unhealthy naming it, the earlier completed pass
    kept as `last_success`; `status --check` exits 1 (healthy: exit 0, says so)."""
    assert "healthy" in after_a_pass.here("status", "--check").stdout
    now = datetime.now(UTC)
    with after_a_pass.store() as store:
        store.record_pass(PassRecord("elsewhere", now, now, "breaker", 78, 0, 0, {"ok": 0}))
    data = status(after_a_pass)
    assert data["healthy"] is False
    assert data["last_pass"]["stopped"] == "breaker"
    assert data["last_success"]["stopped"] == "completed"
    assert any("breaker" in problem for problem in data["problems"])
    done = after_a_pass.here("status", "--check", "--format", "json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["healthy"] is False


def test_status_shows_the_interval_per_class_of_user(after_a_pass: Workspace) -> None:
    """`status` shows the interval and expected delay per class of user, fixed and adaptive
    (the adaptive plan's figures: tests/report/test_plan.py)."""
    fixed = status(after_a_pass)["schedule"]
    assert (fixed["mode"], fixed["stats"]) == ("fixed", "always")
    assert fixed["classes"] == [
        {"class": "active", "users": 3, "interval_s": 3600, "expected_delay_s": 1800},
        *(
            {"class": state, "users": users, "interval_s": 86400, "expected_delay_s": None}
            for state, users in (("parked", 1), ("unlinked", 1), ("rejected", 0))
        ),
    ]
    assert fixed["expected_delay_s"] == 1800
    world = after_a_pass
    world.configure(poll={"schedule": "adaptive", "interval": "15m", "stats": "on_change"})
    sched = status(world)["schedule"]  # its classes and delays: tests/report/test_plan.py
    assert (sched["mode"], sched["stats"], sched["max_interval_s"]) == (
        "adaptive",
        "on_change",
        86400,
    )
    assert sum(c["users"] for c in sched["classes"]) == 5
    table = world.here("status").stdout
    assert "schedule: adaptive, stats on_change" in table
    assert "each user read at least every 1d (per class: schedule)" in table  # max_interval
    assert re.search(r"every \S+, expected delay \S+", table)
    assert "on average (expected)" in table
    assert re.search(r"parked\s+1\s+every 1d", table)
    assert re.search(r"unlinked\s+1\s+every 1d", table)
