"""One pass of the real worker through the simulator: every answer of the spec, end to end."""

from __future__ import annotations

from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from lta_worker.simulator import LATEST_CHANGE_SCOPE, STATS_SCOPE

from .conftest import Harness

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)


async def test_normal_users_are_read_and_stored(harness: Harness) -> None:
    """Every enrolled user gets both endpoints read once, stored as ok, and the pass exits 0."""
    for n in range(5):
        await harness.enroll(f"user-{n}")
    result = await harness.run_pass()
    assert result.exit_code == 0
    assert result.stopped == "completed"
    assert result.reads == 10
    assert result.counts["ok"] == 10
    with harness.store() as store:
        rows = list(store.export_results())
    assert {(r.user, r.endpoint, r.status) for r in rows} == {
        (f"user-{n}", e, "ok") for n in range(5) for e in ("latest-change", "stats")
    }
    assert harness.user("user-0").state == "active"


async def test_revoked_user_token_is_deleted_and_never_read_again(harness: Harness) -> None:
    """PermanentAccessRevoked deletes the token at once; the user is never read again."""
    await harness.enroll("keeps")
    await harness.enroll("leaves")
    await harness.run_pass()
    harness.sim.revoke("leaves")
    harness.advance(HOUR + timedelta(seconds=1))
    result = await harness.run_pass()
    assert result.counts["revoked"] == 1
    row = harness.user("leaves")
    assert row.state == "revoked"
    assert row.token is None
    assert [e.path.rsplit("/", 1)[-1] for e in harness.reads("leaves")][-1] == "latest-change"
    reads_before = len(harness.reads("leaves"))
    harness.advance(timedelta(days=3))
    await harness.run_pass()
    assert len(harness.reads("leaves")) == reads_before
    assert harness.user("keeps").state == "active"


async def test_parked_user_keeps_its_token_and_comes_back_by_itself(harness: Harness) -> None:
    """CloudSyncInactive parks the user (token kept); once syncing resumes it is active again."""
    await harness.enroll("sleepy", last_sync_age_days=120)
    await harness.run_pass()
    row = harness.user("sleepy")
    assert row.state == "parked"
    assert row.token is not None
    harness.sim.set_sync("sleepy", last_sync_age_days=0)
    harness.advance(HOUR + timedelta(seconds=1))
    assert (await harness.run_pass()).reads == 0  # parked users wait for parked_interval
    harness.advance(timedelta(hours=24))
    await harness.run_pass()
    assert harness.user("sleepy").state == "active"


async def test_unlinked_user_keeps_its_token(harness: Harness) -> None:
    """NoCloudSyncLinked marks the user unlinked and keeps the token."""
    await harness.enroll("nolink", linked=False)
    result = await harness.run_pass()
    assert result.counts["unlinked"] == 1
    row = harness.user("nolink")
    assert row.state == "unlinked"
    assert row.token is not None


async def test_a_user_who_granted_one_scope_is_read_on_that_endpoint_only(
    harness: Harness,
) -> None:
    """A scope the user did not grant is never called."""
    await harness.enroll("stats-only", scopes=[STATS_SCOPE])
    await harness.run_pass()
    assert [e.path for e in harness.reads("stats-only")] == ["/api/v1/history/stats"]
    assert harness.user("stats-only").scopes == (STATS_SCOPE,)


async def test_nothing_recorded_is_stored_as_none(harness: Harness) -> None:
    """404 on latest-change stores status none; the user stays active."""
    await harness.enroll("fresh")
    harness.sim.set_payload("fresh", "latest-change", None)
    result = await harness.run_pass()
    assert result.counts["none"] == 1
    with harness.store() as store:
        rows = {r.endpoint: r for r in store.export_results("fresh")}
    assert rows["latest-change"].status == "none"
    assert rows["latest-change"].payload is None
    assert rows["stats"].status == "ok"
    assert harness.user("fresh").state == "active"


async def test_an_unticked_client_scope_skips_that_endpoint(harness: Harness) -> None:
    """403 without a code marks that endpoint denied and keeps reading the other one."""
    await harness.enroll("u1")
    harness.sim.set_client_scopes("demo-client", [LATEST_CHANGE_SCOPE])
    result = await harness.run_pass()
    assert result.counts["scope_denied"] == 1
    row = harness.user("u1")
    assert row.state == "active"
    assert "stats" in row.denied
    harness.advance(HOUR + timedelta(seconds=1))
    await harness.run_pass()
    assert [e.path for e in harness.reads("u1")][-1] == "/api/v1/history/latest-change"


@pytest.mark.parametrize(("users", "most_rejected"), [(8, 7), (2, 2)])  # above, below threshold
async def test_wrong_client_secret_trips_the_breaker_and_changes_nobody(
    harness: Harness, users: int, most_rejected: int
) -> None:
    """Plain 401s for everyone: the pass stops with 78, no user changes; after the fix all read."""
    for n in range(users):
        await harness.enroll(f"user-{n}")
    before = {f"user-{n}": harness.user(f"user-{n}") for n in range(users)}
    harness.secret_file.write_text("not-the-right-secret\n")
    result = await harness.run_pass()
    assert (result.exit_code, result.stopped) == (78, "breaker")
    assert result.counts.get("rejected", 0) <= most_rejected
    for name, row in before.items():
        after = harness.user(name)
        assert (after.state, after.next_due_at, after.token) == (
            row.state,
            row.next_due_at,
            row.token,
        )
    harness.secret_file.write_text("demo-client-secret-not-for-production\n")
    fixed = await harness.run_pass()
    assert (fixed.exit_code, fixed.counts["ok"]) == (0, 2 * users)


async def test_faults_end_cleanly_and_delete_nothing(harness: Harness) -> None:
    """5xx, dropped connections and broken JSON: no crash, no token deleted, all read later."""
    for n in range(6):
        await harness.enroll(f"user-{n}")
    harness.sim.inject_fault("503", count=2)
    harness.sim.inject_fault("drop", count=2)
    harness.sim.inject_fault("broken_json", count=2)
    result = await harness.run_pass()
    assert result.counts["transient"] >= 3
    for n in range(6):
        assert harness.user(f"user-{n}").token is not None
    harness.sim.clear_faults()
    harness.advance(HOUR + timedelta(seconds=1))
    again = await harness.run_pass()
    assert again.counts["transient"] == 0
    with harness.store() as store:
        assert {r.user for r in store.export_results() if r.status == "ok"} == {
            f"user-{n}" for n in range(6)
        }


async def test_deadline_stops_early_and_leaves_the_rest_due(harness: Harness) -> None:
    """A pass that reaches --max-duration exits 75; users not reached stay due."""
    for n in range(6):
        await harness.enroll(f"user-{n}")
    harness.sim.inject_fault("latency", rate=1.0, delay=0.5)
    harness.configure("poll", concurrency=1)
    result = await harness.run_pass(max_duration=timedelta(seconds=1.2))
    assert result.exit_code == 75
    assert result.stopped == "deadline"
    with harness.store() as store:
        assert store.count_due(harness.clock.now()) > 0


@pytest.mark.parametrize(("fault", "users"), [("503", 10), ("drop", 10), ("drop", 2)])
async def test_a_service_down_from_the_start_stops_the_pass_at_once(
    harness: Harness, fault: str, users: int
) -> None:
    """Only 5xx or dropped connections, however few users: `upstream_down` (75) after the first
    burst; tokens kept; the users tried back off within the interval, the rest stay due."""
    for n in range(users):
        await harness.enroll(f"user-{n}")
    harness.sim.configure(header_format="none")
    harness.sim.inject_fault(fault, rate=1.0)
    with capture_logs() as logs:
        result = await harness.run_pass()
    assert (result.stopped, result.exit_code) == ("upstream_down", 75)
    assert result.reads <= 5 and result.wall_s < 5
    now = harness.clock.now()
    rows = [harness.user(f"user-{n}") for n in range(users)]
    assert all(u.token is not None for u in rows)
    tried = [u for u in rows if u.consecutive_failures > 0]
    assert tried and all(now < u.next_due_at <= now + HOUR for u in tried)  # within the interval
    assert all(u.next_due_at <= now for u in rows if u.consecutive_failures == 0)
    hints = [e["hint"] for e in logs if e["event"] == "pass.unreachable"]  # no answer at all
    assert len(hints) == (fault == "drop")
    assert all("backed off" in h and "every user stays due" not in h for h in hints)


async def test_an_empty_pass_is_quiet_at_info(harness: Harness) -> None:
    """A pass with nobody due logs its start and end at debug (an idle `serve` ticks often)."""
    await harness.enroll("u1")
    levels = []
    for _ in range(2):  # a pass that reads, then one with nobody due
        with capture_logs() as logs:
            result = await harness.run_pass()
        levels.append({e["event"]: e["log_level"] for e in logs if e["event"] in PASS_EVENTS})
    assert (result.stopped, result.users, result.reads) == ("completed", 0, 0)
    assert levels == [dict.fromkeys(PASS_EVENTS, "info"), dict.fromkeys(PASS_EVENTS, "debug")]


PASS_EVENTS = ("pass.started", "pass.finished")
