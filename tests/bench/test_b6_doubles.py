"""B6 counts a double from the database's record of who held each lease when, not from how
close two instances' reads came (issue 28)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from bench.b6_soak import Fleet, Incarnation, doubles, webhook_order

T0 = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
MARGIN = 2.0  # a third of a 6 s lease: a holder sends no read later than this before its end


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def incarnation(tmp: Path, name: str, reads: list[float], offset: float | None = None) -> Any:
    """A `serve` log: started as instance `name`, then 200 reads of u1 at `reads` (s)."""
    lines = [{"event": "service.started", "instance": name, "ts": at(0).isoformat()}]
    for second in reads:
        lines.append(
            {
                "event": "poll.read",
                "user": "u1",
                "endpoint": "latest-change",
                "status": 200,
                "duration_ms": 10.0,
                "ts": at(second + 0.01).isoformat(),
            }
        )
    log = tmp / f"serve-{name}.log"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return Incarnation(0, cast(Any, None), log, offset)


def change(op: str, second: float, owner: str | None, old: str | None = None, **ends: float) -> Any:
    """One row of the lease log (expires_at / old_expires_at in seconds)."""
    return {
        "op": op,
        "at": at(second),
        "user_id": 1,
        "owner": owner,
        "old_owner": old,
        "expires_at": at(ends["until"]) if "until" in ends else None,
        "old_expires_at": at(ends["old_until"]) if "old_until" in ends else None,
    }


# (case, A's reads, B's reads, B's clock offset, the lease log, doubles expected)
CASES = [
    (
        "released, then claimed and read 0.2 s later: no double",
        [1.0],
        [2.3],
        None,
        [change("claim", 0, "A", until=6), change("end", 2, None, "A"), change("claim", 2.1, "B")],
        0,
    ),
    (
        "the holder reads on after its lapsed lease was taken over",
        [1.0, 7.0],
        [6.6],
        None,
        [change("claim", 0, "A", until=6), change("take", 6.5, "B", "A", until=12, old_until=6)],
        1,
    ),
    (
        "taken over by a clock 2.6 s ahead, while the holder may still read (margin 2 s)",
        [1.0],
        [3.6],
        2.6,
        [change("claim", 0, "A", until=6), change("take", 3.5, "B", "A", until=12, old_until=6)],
        1,
    ),
    (
        "taken over by a clock a quarter lease ahead, within the holder's margin: no double",
        [1.0, 3.9],
        [4.7],
        1.5,
        [change("claim", 0, "A", until=6), change("take", 4.6, "B", "A", until=12, old_until=6)],
        0,
    ),
    (
        "taken over after the lease's end: no double",
        [1.0, 3.9],
        [6.2],
        1.5,
        [change("claim", 0, "A", until=6), change("take", 6.1, "B", "A", until=12, old_until=6)],
        0,
    ),
    (
        "a late renewal shortened A's lease, B took it before the end A was given",
        [1.0],
        [7.2],
        None,
        [
            change("claim", 0, "A", until=6),
            change("take", 6.1, "A", "A", until=12, old_until=6),
            change("renew", 6.5, "A", "A", until=5, old_until=12),
            change("take", 7.0, "B", "A", until=13, old_until=5),
        ],
        1,
    ),
    (
        "users drop ended A's lease while its turn was out: no second instance read",
        [1.0, 2.5],
        [],
        None,
        [
            change("claim", 0, "A", until=6),
            change("end", 2, None, "A"),
            change("claim", 2, "drop:x"),
        ],
        0,
    ),
]


@pytest.mark.parametrize("case", [pytest.param(case[1:], id=case[0]) for case in CASES])
def test_a_double_is_a_read_outside_the_readers_own_lease(
    tmp_path: Path, case: tuple[list[float], list[float], float | None, list[Any], int]
) -> None:
    """A double is only a read made while another instance held the lease, however close."""
    a_reads, b_reads, b_offset, log, expected = case
    a, b = incarnation(tmp_path, "A", a_reads), incarnation(tmp_path, "B", b_reads, b_offset)
    fleet = cast(Fleet, SimpleNamespace(all=[a, b]))
    found = doubles(fleet, log, {"u1": 1}, T0.timestamp(), margin_s=MARGIN)
    assert len(found) == expected, found


def _event(n: int, user: str, new_state: str, timestamp: float) -> dict[str, Any]:
    stamp = (datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=timestamp)).isoformat()
    return {"id": n, "user": user, "type": f"user.{new_state}", "new_state": new_state,
            "timestamp": stamp, "received": float(n)}  # fmt: skip


@pytest.mark.parametrize(
    ("stamps", "step", "out_of_order"),
    [
        ((10.0, 20.0), 0.0, 0),  # in order
        ((20.0, 17.0), 5.0, 0),  # back by 3 s, within a 5 s stepped clock
        ((20.0, 13.0), 5.0, 1),  # back by 7 s: beyond the step and its slack
        ((20.0, 18.5), 0.0, 1),  # no stepped clock: 1.5 s back is beyond the slack
    ],
)
def test_webhooks_received_out_of_order_beyond_the_stepped_clock_count(
    stamps: tuple[float, float], step: float, out_of_order: int
) -> None:
    """Receipt order is judged; a timestamp may go back by the stepped clock's step plus 1 s."""
    received = [_event(1, "u", "revoked", stamps[0]), _event(2, "u", "active", stamps[1])]
    final = {"u": {"state": "active"}}
    _, missing, late = webhook_order({"u"}, final, received, clock_step_s=step)
    assert (len(late), missing) == (out_of_order, [])


def test_the_last_webhook_received_must_name_the_final_state() -> None:
    """A user whose last event received is not its final state is missing an event."""
    received = [_event(1, "u", "active", 10.0), _event(2, "u", "revoked", 5.0)]
    _, missing, _ = webhook_order({"u"}, {"u": {"state": "active"}}, received, clock_step_s=6.0)
    assert missing == [{"user": "u", "state": "active", "last_event": "revoked"}]
