"""The pass's circuit breaker, driven directly as a table (domain/_breaker.py)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from lta_worker.domain import Breaker, Outcome, Proof, StopReason
from lta_worker.domain._breaker import Routed
from lta_worker.domain._outcomes import OutcomeKind

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
    Row("a 404 with nothing else asks the urls proof", [NONE_404], "check"),
    Row("404s after a 200 never ask nor trip", [OK, *[NONE_404] * (THRESHOLD + 2)], None),
    Row("404s after a plain 401 never trip (the URL exists)", [PLAIN_401, *[STATS_404] * 5], None),
    Row("failures before any acceptance: down at the threshold", [DOWN] * THRESHOLD, "down"),
    Row("5xx count like network failures", [E503] * THRESHOLD, "down"),
    Row("after an acceptance more failures are needed", [OK, *[DOWN] * THRESHOLD], None),
    Row("after an acceptance: down at down_after", [OK, *[DOWN] * DOWN_AFTER], "down"),
    Row("a 429 neither breaks nor extends the run", [DOWN, R429, DOWN, DOWN], "down"),
    Row("an answer breaks the run", [DOWN, DOWN, PLAIN_401, DOWN, DOWN], None),
    Row("a 200 breaks the run too", [DOWN, DOWN, OK, DOWN, DOWN], None),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in OBSERVE_ROWS])
def test_observe_row(row: Row) -> None:
    """Each row: the signal after its last answer (each from another user), and none before."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    signals = [breaker.observe(a, user) for user, a in enumerate(row.answers)]
    assert signals[:-1] == [None] * (len(signals) - 1)
    assert signals[-1] == row.signal


def test_an_authenticated_answer_releases_held_rejections_in_order() -> None:
    """Once another user is accepted the plain 401s are per-user: written, held ones first."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    breaker.observe(PLAIN_401, "a")
    assert breaker.route("a", saw_404=False, rejected=True) == Routed(check="client")
    breaker.observe(OK, "b")
    assert breaker.route("b", saw_404=False, rejected=False).release == ["a", "b"]
    breaker.observe(PLAIN_401, "c")
    assert breaker.route("c", saw_404=False, rejected=True).release == ["c"]


def test_404_decisions_wait_for_proof_of_the_urls() -> None:
    """A turn that saw a 404 is held until an answer proves the URLs, then written."""
    breaker: Breaker[str] = Breaker(THRESHOLD, DOWN_AFTER)
    breaker.observe(NONE_404, "a")
    assert breaker.route("a", saw_404=True, rejected=False).release == []
    breaker.observe(OK, "b")
    assert breaker.route("b", saw_404=False, rejected=False).release == ["a", "b"]


Turn = tuple[Outcome, bool, bool]  # a user's read: outcome, saw_404, rejected
R401: Turn = (PLAIN_401, False, True)
N404: Turn = (NONE_404, True, False)


class Evidence(NamedTuple):
    """Users' turns (distinct users unless `one_user`), the answer to each proof (None: no
    answer), how the pass ends and which decisions are written."""

    name: str
    turns: list[Turn]
    proofs: dict[str, bool | None]
    ends: StopReason
    written: list[int]
    one_user: bool = False


EVIDENCE_ROWS = [
    Evidence("one plain 401, the token endpoint accepts the client: rejected", [R401],
             {"client": True}, "completed", [0]),
    Evidence("one plain 401, no answer to the proof: rejected all the same", [R401],
             {"client": None}, "completed", [0]),
    Evidence("one plain 401 and invalid_client: proven, breaker", [R401], {"client": False},
             "breaker", []),
    Evidence("threshold users' plain 401s, no answer to the proof: breaker", [R401] * THRESHOLD,
             {"client": None}, "breaker", []),
    Evidence("threshold users' plain 401s, the client accepted: each rejected",
             [R401] * THRESHOLD, {"client": True}, "completed", list(range(THRESHOLD))),
    Evidence("one user's 404, a read path answers 401: none written", [N404], {"urls": True},
             "completed", [0]),
    Evidence("one user's 404, no answer to the proof: not written, no trip", [N404],
             {"urls": None}, "completed", []),
    Evidence("one user's 404 and the read path 404 too: breaker", [N404], {"urls": False},
             "breaker", []),
    Evidence("threshold users' 404s, no answer to the proof: breaker", [N404] * THRESHOLD,
             {"urls": None}, "breaker", []),
    Evidence("threshold users' 404s, the URLs proven: each none", [N404] * THRESHOLD,
             {"urls": True}, "completed", list(range(THRESHOLD))),
    Evidence("one user's many 404s never make several users", [N404] * (THRESHOLD + 1),
             {"urls": None}, "completed", [], one_user=True),
]  # fmt: skip


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in EVIDENCE_ROWS])
def test_evidence_row(row: Evidence) -> None:
    """Each row: what the users' answers come to, given the proofs', each proof asked once."""
    breaker: Breaker[int] = Breaker(THRESHOLD, DOWN_AFTER)
    asked: list[str] = []
    tripped = False

    def prove(proof: Proof) -> None:
        nonlocal tripped
        asked.append(proof)
        tripped = breaker.prove(proof, row.proofs[proof]) or tripped

    written: list[int] = []
    for index, (outcome, saw_404, rejected) in enumerate(row.turns):
        if breaker.observe(outcome, 0 if row.one_user else index) == "check":
            prove("urls")
        routed = breaker.route(index, saw_404=saw_404, rejected=rejected)
        tripped = tripped or routed.trip
        if routed.check is not None:
            prove(routed.check)
        written += routed.release
    for proof in breaker.wanted():
        prove(proof)
    ends, released = breaker.finish("breaker" if tripped else "completed")
    assert (ends, sorted(written + released)) == (row.ends, row.written)
    assert asked == [*row.proofs]
    if ends == "breaker":
        assert breaker.proven is (False in row.proofs.values())


class End(NamedTuple):
    """What the breaker holds at the end of a pass, how it stopped, and how it ends."""

    name: str
    answers: list[tuple[Outcome, bool, bool]]  # outcome, saw_404, rejected
    stopped: StopReason
    ends: StopReason
    written: list[int]


END_ROWS = [
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
        breaker.observe(outcome, index)
        written += breaker.route(index, saw_404=saw_404, rejected=rejected).release
    ends, released = breaker.finish(row.stopped)
    assert ends == row.ends
    assert sorted(written + released) == row.written


def test_limits_must_be_positive() -> None:
    """A breaker that could never trip (or always would) is refused."""
    with pytest.raises(ValueError, match="at least 1"):
        Breaker(0, 5)
