"""A budget too small for one window, paced over several windows in real time, with no 429."""

from __future__ import annotations

from collections import Counter

import pytest

from .conftest import Harness

pytestmark = pytest.mark.anyio

WINDOW = 3
BUDGET = 6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("header_format", ["draft", "combined", "triple", "x"])
async def test_every_due_user_is_read_over_several_windows_without_a_429(
    realtime_harness: Harness, header_format: str
) -> None:
    """More due reads than one window allows: all are made, none over budget, no 429."""
    h = realtime_harness
    h.sim.configure(budget=BUDGET, window=WINDOW, header_format=header_format)
    users = [f"user-{n}" for n in range(5)]
    for user in users:
        await h.enroll(user)
    h.sim.clear_requests()
    result = await h.run_pass()
    assert result.exit_code == 0
    assert result.throttled == 0
    reads = h.reads()
    assert len(reads) == 2 * len(users)
    assert all(e.status == 200 for e in reads)
    # Bucket the reads into the server's fixed windows: none holds more than the budget
    # less the reserve (10% of 6 leaves 5 for this worker).
    per_window = Counter(int(e.at.timestamp() // WINDOW) for e in reads)
    assert max(per_window.values()) <= int(BUDGET * 0.9)
    assert len(per_window) >= 2
