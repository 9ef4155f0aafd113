"""The pass's circuit breaker, driven directly as a table (domain/_breaker.py)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from lta_worker.domain import Breaker, Outcome, OutcomeKind, StopReason

THRESHOLD = 3
DOWN_AFTER = 5


def answer(kind: OutcomeKind, status: int | None) -> Outcome:
    """An outcome of `kind` that came with `status` (None: no answer)."""
    return Outcome(kind=kind, status=status)


OK = answer("ok", 200)
NONE_404 = answer("none", 404)
STATS_404 = answer("transient", 404)
PLAIN_401 = answer("rejected", 401)
DOWN = answer("transient", None)
E503 = answer("transient", 503)
R429 = answer("rate_limited", 429)
REVOKED = answer("revoked", 401)


class Row(NamedTuple):
    """Answers observed in order, then what the breaker says after the last one."""

    name: str
    answers: list[Outcome]
    signal: str | None


OBSERVE_ROWS = [
    Row("404s up to the threshold with nothing else trip", [NONE_404] * THRESHOLD, "trip"),
    Row("404s after a 200 never trip", [OK, *[NONE_404] * (THRESHOLD + 2)], None),
    Row("404s after a plain 401 never trip (the URL exists)", [PLAIN_401, *[STATS_404] * 5], None),
    Row("failures before any acceptance: down at the threshold", [DOWN] * THRESHOLD, "down"),
    Row("5xx count like network failures", [E503] * THRESHOLD, "down"),
    Row("after an acceptance more failures are needed", [OK, *[DOWN] * THRESHOLD], None),
    Row("after an acceptance: down at down_after", [OK, *[DOWN] * DOWN_AFTER], "down"),
    Row("a 429 neither breaks nor extends the run", [DOWN, R429, DOWN, DOWN], "down"),
    Row("an answer breaks the run", [DOWN, DOWN, PLAIN_401, DOWN, DOWN], None),
    Row("a 404 breaks the run too", [DOWN, DOWN, NONE_404, DOWN, DOWN], None),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in OBSERVE_ROWS])
def test_observe_row(row: Row) -> None:
    """Each row: the signal after its last answer, and none before it."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    signals = [breaker.observe(a) for a in row.answers]
    assert signals[:-1] == [None] * (len(signals) - 1)
    assert signals[-1] == row.signal


def test_a_404_trip_names_its_cause() -> None:
    """Tripping on 404s says `http_404`, which names service.base_url in the hint."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    for _ in range(THRESHOLD):
        breaker.observe(NONE_404)
    assert breaker.cause == "http_404"


def test_rejected_decisions_are_held_until_the_threshold_trips() -> None:
    """Plain-401 turns with nothing authenticated are held; the threshold-th trips."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    routed = []
    for user in ("a", "b", "c"):
        breaker.observe(PLAIN_401)
        routed.append(breaker.route(user, saw_404=False, rejected=True))
    assert [r.release for r in routed] == [[], [], []]
    assert [r.trip for r in routed] == [False, False, True]
    assert breaker.finish("breaker") == ("breaker", [])  # dropped: nobody changes


def test_an_authenticated_answer_releases_held_rejections_in_order() -> None:
    """Once another user is accepted the plain 401s are per-user: written, held ones first."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    breaker.observe(PLAIN_401)
    assert breaker.route("a", saw_404=False, rejected=True).release == []
    breaker.observe(OK)
    assert breaker.route("b", saw_404=False, rejected=False).release == ["a", "b"]
    breaker.observe(PLAIN_401)
    assert breaker.route("c", saw_404=False, rejected=True).release == ["c"]


def test_404_decisions_wait_for_proof_of_the_urls() -> None:
    """A turn that saw a 404 is held until an answer proves the URLs, then written."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    breaker.observe(NONE_404)
    assert breaker.route("a", saw_404=True, rejected=False).release == []
    breaker.observe(OK)
    assert breaker.route("b", saw_404=False, rejected=False).release == ["a", "b"]


class End(NamedTuple):
    """What the breaker holds at the end of a pass, how it stopped, and how it ends."""

    name: str
    answers: list[tuple[Outcome, bool, bool]]  # outcome, saw_404, rejected
    stopped: StopReason
    ends: StopReason
    written: list[int]


END_ROWS = [
    End("only 404s, fewer than the threshold: breaker", [(NONE_404, True, False)], "completed",
        "breaker", []),
    End("only plain 401s, fewer than the threshold: breaker", [(PLAIN_401, False, True)],
        "completed", "breaker", []),
    End("no answer at all, however few reads: upstream_down", [(DOWN, False, False)],
        "completed", "upstream_down", [0]),
    End("a 404 then proof: completed, both written", [(NONE_404, True, False), (OK, False, False)],
        "completed", "completed", [0, 1]),
    End("held 404s are never written at a deadline without proof", [(NONE_404, True, False)],
        "deadline", "deadline", []),
    End("held 401s are written at a deadline (per-user rejections)", [(PLAIN_401, False, True)],
        "deadline", "deadline", [0]),
    End("a configuration stop drops everything held", [(PLAIN_401, False, True)], "config",
        "config", []),
    End("every answer a 429: throttled, written", [(R429, False, False), (R429, False, False)],
        "completed", "throttled", [0, 1]),
    End("429s and no answer otherwise: throttled", [(R429, False, False), (DOWN, False, False)],
        "completed", "throttled", [0, 1]),
    End("429s and one read answered: completed", [(R429, False, False), (OK, False, False)],
        "completed", "completed", [0, 1]),
    End("429s up to a deadline: the deadline", [(R429, False, False)], "deadline", "deadline",
        [0]),
]  # fmt: skip


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in END_ROWS])
def test_finish_row(row: End) -> None:
    """Each row: the final stop reason, and exactly the decisions written (pass order)."""
    breaker: Breaker[int] = Breaker(THRESHOLD, DOWN_AFTER)
    written: list[int] = []
    for index, (outcome, saw_404, rejected) in enumerate(row.answers):
        breaker.observe(outcome)
        written += breaker.route(index, saw_404=saw_404, rejected=rejected).release
    ends, released = breaker.finish(row.stopped)
    assert ends == row.ends
    assert sorted(written + released) == row.written


def test_limits_must_be_positive() -> None:
    """A breaker that could never trip (or always would) is refused."""
    with pytest.raises(ValueError, match="at least 1"):
        Breaker(0, 5)
