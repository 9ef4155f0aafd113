"""The budget: pure window arithmetic and header rendering, then the same through HTTP."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.simulator import DEMO_CLIENT_ID, Simulator
from lta_worker.simulator.budget import (
    Quota,
    Window,
    quota,
    render,
    retry_after,
    roll,
    spend,
    take,
    window_start,
)

from .helpers import STATS, TOKENS, Flow, bearer

T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z, the manual clock's default start

# -- pure arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "length", "start"),
    [(T0, 3600, T0), (T0 + 3599.9, 3600, T0), (T0 + 3600, 3600, T0 + 3600), (T0 + 7, 5, T0 + 5)],
)
def test_window_start_is_fixed_and_epoch_aligned(now: float, length: int, start: float) -> None:
    """A window starts at the last multiple of its length since the epoch."""
    assert window_start(now, length) == start


def test_window_of_zero_length_is_refused() -> None:
    """A window must last at least one second."""
    with pytest.raises(ValueError, match="at least one second"):
        window_start(T0, 0)


def test_take_counts_until_the_limit_then_refuses_without_counting() -> None:
    """take() allows `limit` requests per window; refused ones are not counted."""
    window = None
    for _ in range(3):
        window, allowed = take(window, T0, 3, 60)
        assert allowed
    refused_window, allowed = take(window, T0 + 1, 3, 60)
    assert not allowed
    assert refused_window == Window(T0, 3)


def test_a_new_window_starts_from_zero() -> None:
    """Once the window is over the count starts again."""
    window = Window(T0, 3)
    assert roll(window, T0 + 60, 60) == Window(T0 + 60, 0)
    assert take(window, T0 + 60, 3, 60) == (Window(T0 + 60, 1), True)


def test_a_clock_set_backwards_does_not_reuse_a_later_count() -> None:
    """Going back in time gives the earlier window, counted afresh."""
    assert roll(Window(T0 + 60, 3), T0, 60) == Window(T0, 0)


def test_spend_counts_other_traffic_past_the_limit() -> None:
    """spend() records the client's other traffic; remaining never goes negative."""
    window = spend(None, T0, 60, 10)
    assert window.used == 10
    assert quota(window, T0, 3, 60).remaining == 0
    with pytest.raises(ValueError, match="negative"):
        spend(None, T0, 60, -1)


@pytest.mark.parametrize(
    ("now", "reset", "reset_at"),
    [(T0, 3600, T0 + 3600), (T0 + 1800, 1800, T0 + 3600), (T0 + 3599.5, 1, T0 + 3600)],
)
def test_quota_reports_seconds_to_reset_rounded_up(now: float, reset: int, reset_at: float) -> None:
    """reset counts whole seconds to the window's end, never 0; reset_at is its epoch time."""
    q = quota(Window(T0, 20), now, 120, 3600)
    assert (q.limit, q.remaining, q.reset, q.reset_at, q.window) == (
        120,
        100,
        reset,
        int(reset_at),
        3600,
    )
    assert retry_after(q) == reset


Q = Quota(limit=120, remaining=7, reset=42, reset_at=1_735_693_200, window=3600)


def test_render_refuses_an_unknown_format() -> None:
    """An unknown header format is an error, not silence."""
    with pytest.raises(ValueError, match="unknown header format"):
        render("bogus", Q)  # type: ignore[arg-type]


@given(
    limit=st.integers(min_value=0, max_value=20),
    length=st.integers(min_value=1, max_value=100),
    steps=st.lists(st.floats(min_value=0, max_value=30, allow_nan=False), max_size=200),
)
def test_never_more_than_limit_allowed_in_any_window(
    limit: int, length: int, steps: list[float]
) -> None:
    """Whatever the timing of requests, no window ever allows more than `limit`."""
    window, now, allowed_per_window = None, T0, {}
    for step in steps:
        now += step
        window, allowed = take(window, now, limit, length)
        if allowed:
            start = window_start(now, length)
            allowed_per_window[start] = allowed_per_window.get(start, 0) + 1
        q = quota(window, now, limit, length)
        assert 0 <= q.remaining <= limit
        assert 1 <= q.reset <= length
    assert all(count <= limit for count in allowed_per_window.values())


# -- through HTTP -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        (
            "draft",
            {"ratelimit": '"default";r=9;t=3600', "ratelimit-policy": '"default";q=10;w=3600'},
        ),
        ("combined", {"ratelimit": "limit=10, remaining=9, reset=3600"}),
        (
            "triple",
            {"ratelimit-limit": "10", "ratelimit-remaining": "9", "ratelimit-reset": "3600"},
        ),
        (
            "x",
            {
                "x-ratelimit-limit": "10",
                "x-ratelimit-remaining": "9",
                "x-ratelimit-reset": str(int(T0) + 3600),
            },
        ),
        ("none", {}),
    ],
)
async def test_each_header_format_on_the_wire(
    flow: Flow, fmt: str, expected: dict[str, str]
) -> None:
    """A read carries the RateLimit headers of the chosen format."""
    credential = await flow.enrolled()
    flow.sim.configure(budget=10, header_format=fmt)
    response = await flow.http.get(STATS, headers=bearer(credential))
    seen = {k: v for k, v in response.headers.items() if "ratelimit" in k}
    assert seen == expected


@pytest.mark.anyio
async def test_spent_budget_gives_429_with_retry_after_and_headers(flow: Flow) -> None:
    """When the budget is spent the answer is 429, Retry-After until the reset, and headers."""
    credential = await flow.enrolled()
    flow.sim.configure(budget=2, window=60)
    flow.sim.advance(15)
    for _ in range(2):
        assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200
    refused = await flow.http.get(STATS, headers=bearer(credential))
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "45"
    assert refused.headers["ratelimit"] == '"default";r=0;t=45'


@pytest.mark.anyio
async def test_every_public_request_counts_but_429s_and_auth_service_do_not(
    flow: Flow, sim: Simulator, http: httpx.AsyncClient
) -> None:
    """Reads, refusals and other endpoints all count; 429s and the auth service do not."""
    credential = await flow.enrolled()
    sim.configure(budget=5)
    sim.set_payload("alice", "latest-change", None)
    await http.get("/api/v1/history/latest-change", headers=bearer(credential))  # 404
    sim.set_sync("alice", last_sync_age_days=100)
    await http.get(STATS, headers=bearer(credential))  # 403
    await http.post(TOKENS, headers=bearer(credential))  # auth service: not counted
    await http.delete(TOKENS, headers={})  # auth service: not counted
    assert sim.budget_of(DEMO_CLIENT_ID).remaining == 3


@pytest.mark.anyio
async def test_unauthenticated_requests_count_in_their_own_bucket(
    flow: Flow, sim: Simulator
) -> None:
    """A plain 401 is counted apart from the client, so it reveals nothing about the client."""
    credential = await flow.enrolled()
    sim.configure(budget=3)
    for _ in range(3):
        await flow.http.get(STATS, headers=bearer("dspa_unknown.secret"))
    assert (await flow.http.get(STATS, headers=bearer("dspa_unknown.secret"))).status_code == 429
    assert (await flow.http.get(STATS, headers=bearer(credential))).status_code == 200
