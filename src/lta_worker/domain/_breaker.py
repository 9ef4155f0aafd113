"""The pass's circuit breaker: a pure state machine over answers, decisions and proofs.

Plain 401s with nothing authenticated hold the turns ending `rejected` (proof `client`: a code
exchange, `invalid_client`); 404s with nothing proving the URLs hold the turns that saw one
(proof `urls`: a read path without a credential). A proof releases or trips; without its answer,
`threshold` distinct users trip; a trip changes no user. A run of failures is `down`.
docs/operations.md, *The circuit breaker in service mode*; DESIGN.md, *Rules from the spec*.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeVar

from lta_worker.domain._outcomes import Outcome
from lta_worker.domain._policy import authenticated
from lta_worker.errors import EX_CONFIG, EX_OK, EX_TEMPFAIL

T = TypeVar("T")
StopReason = Literal[
    "completed", "deadline", "breaker", "upstream_down", "throttled", "cancelled", "config"
]
Trip = Literal["plain_401", "http_404"]
Proof = Literal["client", "urls"]
Signal = Literal["trip", "down", "check"]
EXIT_CODES: Final[dict[StopReason, int]] = {
    "completed": EX_OK,
    "deadline": EX_TEMPFAIL,
    "upstream_down": EX_TEMPFAIL,
    "throttled": EX_TEMPFAIL,
    "cancelled": EX_TEMPFAIL,
    "breaker": EX_CONFIG,
    "config": EX_CONFIG,
}
# What each proof is about, and the trip it leads to.
CAUSES: Final[dict[Proof, Trip]] = {"client": "plain_401", "urls": "http_404"}
TRIP_HINTS: Final[dict[Trip, str]] = {
    "http_404": "reads answered 404 and nothing proved the URLs right (a read path without "
    "credential answers 404, or several users' 404s): service.base_url (or its path prefix) "
    "is likely wrong; no user was changed",
    "plain_401": "reads answered a plain 401 and nothing proved the client right (the token "
    "endpoint answers invalid_client, or several users' 401s): the client secret "
    "(client.secret_file) or the client configuration is likely wrong; no user was changed",
}


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """What to do with a decision handed to `Breaker.route`: the decisions to write now (held
    ones first), whether to stop the pass, and the proof to ask now (for `Breaker.prove`)."""

    release: list[T] = field(default_factory=list)
    trip: bool = False
    check: Proof | None = None


class Breaker(Generic[T]):
    """Holds decisions while the pass has no proof that the client and URLs are right.

    `threshold`: distinct users held for one cause, with no answer to its proof, that trip
    it; also the run of failures that means "down" before any authenticated answer (a cron
    run would otherwise wait out the slow fallback rate). `down_after`: that run once the
    client was accepted.
    """

    def __init__(self, threshold: int, down_after: int) -> None:
        if threshold < 1 or down_after < 1:
            raise ValueError("threshold and down_after must be at least 1")
        self.threshold = threshold
        self.down_after = down_after
        self.cause: Trip = "plain_401"
        self.proven = False  # the trip's cause was proven by the service, not by users
        self.reads = 0
        self.answered = 0
        self.throttled = 0
        self.authenticated = 0
        self.url_proven = False
        self.proofs: dict[Proof, bool | None] = {}  # asked: True right, False wrong
        self._users_404: set[Hashable] = set()
        self._failures_in_a_row = 0
        self._held_rejected: list[T] = []
        self._held_404: list[T] = []

    @property
    def client_accepted(self) -> bool:
        """An answer or the token endpoint proved the client's credentials right."""
        return self.authenticated > 0 or self.proofs.get("client") is True

    def observe(self, outcome: Outcome, user: Hashable = None) -> Signal | None:
        """Count one read's outcome; `down`/`trip`: stop the pass, `check`: ask the `urls` proof."""
        self.reads += 1
        status = outcome.status
        if status is not None:
            self.answered += 1
            self.throttled += outcome.kind == "rate_limited"
            if 200 <= status < 300 or status in (401, 403):
                self.url_proven = True  # the endpoint exists at this URL
        if authenticated(outcome):
            self.authenticated += 1
        if outcome.kind == "transient" and status != 404:
            self._failures_in_a_row += 1
            limit = self.down_after if self.authenticated else self.threshold
            if self._failures_in_a_row >= limit:
                return "down"
        elif outcome.kind != "rate_limited":
            self._failures_in_a_row = 0
        if status == 404 and not self.url_proven:
            self._users_404.add(user)
            return self._suspect("urls")
        return None

    def route(self, decision: T, *, saw_404: bool, rejected: bool) -> Routed[T]:
        """Hold a decision (saw a 404, or `rejected` on a plain 401) or release what it lets go."""
        if saw_404 and not self.url_proven:
            self._held_404.append(decision)
            return Routed()
        if rejected and not self.client_accepted:
            self._held_rejected.append(decision)
            signal = self._suspect("client")
            return Routed(trip=signal == "trip", check="client" if signal == "check" else None)
        return Routed(release=[*self._release(), decision])

    def prove(self, proof: Proof, right: bool | None) -> bool:
        """Take the answer to `proof` (None: unknown); True when the pass must stop here."""
        self.proofs[proof] = right
        if right is True and proof == "urls":
            self.url_proven = True
        return self._suspect(proof) == "trip"

    def wanted(self) -> list[Proof]:
        """The proofs not asked yet that held decisions wait for (asked before `finish`)."""
        held = {"client": self._held_rejected and not self.client_accepted,
                "urls": self._held_404 and not self.url_proven}  # fmt: skip
        return [p for p in CAUSES if held[p] and p not in self.proofs]

    def finish(self, stopped: StopReason) -> tuple[StopReason, list[T]]:
        """How the pass ends, given how it stopped, and the held decisions to write."""
        if stopped == "completed":
            tripped = (self._held_404 and self._suspect("urls") == "trip") or (
                self._held_rejected and self._suspect("client") == "trip"
            )
            if tripped:
                stopped = "breaker"
            elif self.reads and not self.answered:
                stopped = "upstream_down"
            elif self.answered and self.throttled == self.answered:
                stopped = "throttled"
        if stopped in ("breaker", "config"):
            self._held_rejected.clear()
            self._held_404.clear()
            return stopped, []
        # A 404 decision is written only once an answer proved the URLs right, whatever
        # else stopped the pass (a wrong URL must never store `none`).
        released = [*self._held_rejected, *(self._held_404 if self.url_proven else [])]
        self._held_rejected.clear()
        self._held_404.clear()
        return stopped, released

    def _suspect(self, proof: Proof) -> Signal | None:
        """What the evidence for `proof`'s cause says now: `check` (ask the proof), `trip`
        (proven wrong, or `threshold` distinct users and no answer to the proof), or None."""
        if proof == "urls":
            if self.url_proven:
                return None
            users = len(self._users_404)
        else:
            if self.client_accepted:
                return None
            users = len(self._held_rejected)
        if proof not in self.proofs:
            return "check"
        right = self.proofs[proof]
        if right is False or (right is None and users >= self.threshold):
            self.cause, self.proven = CAUSES[proof], right is False
            return "trip"
        return None

    def _release(self) -> list[T]:
        released: list[T] = []
        if self._held_rejected and self.client_accepted:
            released, self._held_rejected = self._held_rejected, []
        if self._held_404 and self.url_proven:
            released, self._held_404 = [*released, *self._held_404], []
        return released
