"""The pass's circuit breaker: a pure state machine over answers and decisions.

A pass must not change users on evidence that the client itself is misconfigured. Two
kinds of answers say so without proving it, one read at a time, so the decisions they lead
to are *held* until the pass knows more:

| seen, with nothing proving otherwise | held                    | at the threshold        |
|--------------------------------------|-------------------------|-------------------------|
| plain 401s, nothing authenticated    | turns ending `rejected` | trip `plain_401`: 78    |
| 404s, nothing proving the URLs       | turns that saw a 404    | trip `http_404`: 78     |
| network failures and 5xx in a row    | nothing                 | `upstream_down`: 75     |

- An authenticated answer (`policy.authenticated`) releases the held plain-401 decisions
  (other users are fine: those are per-user rejections, written as such).
- An answer proving the URLs right releases the held 404 decisions (a 404 on
  latest-change is "nothing recorded" after all).
- A trip drops every held decision: no user changes state or schedule.
- At the end of a pass that completed, what is still held decides: only 404s and nothing
  proving the URLs, or only plain 401s and nothing authenticated, trip the breaker; reads
  without a single answer (every one a network failure) end the pass as `upstream_down`,
  whatever the number of users; reads whose every answer was a 429 end it as `throttled`
  (75: nobody was read, the users stay due), however short the service's Retry-After, so
  that a throttled service does not look like a pass that completed.
- The run of failures that means "the service is down" is `threshold` long before any
  authenticated answer (a cron run would otherwise wait out the slow fallback rate) and
  `down_after` long once the service has accepted the client.

No I/O, no clock; the engine feeds it and acts on what it returns.
"""

from __future__ import annotations

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
Signal = Literal["trip", "down"]
EXIT_CODES: Final[dict[StopReason, int]] = {
    "completed": EX_OK,
    "deadline": EX_TEMPFAIL,
    "upstream_down": EX_TEMPFAIL,
    "throttled": EX_TEMPFAIL,
    "cancelled": EX_TEMPFAIL,
    "breaker": EX_CONFIG,
    "config": EX_CONFIG,
}


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """What to do with a decision handed to `Breaker.route`.

    Attributes:
        release: Decisions to write now, in order (held ones first); empty while held.
        trip: True when holding this one reached the threshold: stop the pass.
    """

    release: list[T] = field(default_factory=list)
    trip: bool = False


class Breaker(Generic[T]):
    """Holds decisions while the pass has no proof that the client and URLs are right.

    Args:
        threshold: Held plain-401 decisions, or 404 answers, that trip the breaker; also
            the run of failures that means "down" before any authenticated answer.
        down_after: The run of failures that means "down" once the client was accepted.
    """

    def __init__(self, threshold: int, down_after: int) -> None:
        if threshold < 1 or down_after < 1:
            raise ValueError("threshold and down_after must be at least 1")
        self.threshold = threshold
        self.down_after = down_after
        self.cause: Trip = "plain_401"
        self.reads = 0
        self.answered = 0
        self.throttled = 0
        self.authenticated = 0
        self.url_proven = False
        self._answers_404 = 0
        self._failures_in_a_row = 0
        self._held_rejected: list[T] = []
        self._held_404: list[T] = []

    def observe(self, outcome: Outcome) -> Signal | None:
        """Count one read's outcome; say `trip` or `down` when the pass must stop."""
        self.reads += 1
        status = outcome.status
        if status is not None:
            self.answered += 1
            self.throttled += outcome.kind == "rate_limited"
            if status == 404:
                self._answers_404 += 1
            elif 200 <= status < 300 or status in (401, 403):
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
        if status == 404 and not self.url_proven and self._answers_404 >= self.threshold:
            # As many 404s as the pacer's first burst and nothing else: stop before
            # waiting out the slow fallback rate for more of the same.
            self.cause = "http_404"
            return "trip"
        return None

    def route(self, decision: T, *, saw_404: bool, rejected: bool) -> Routed[T]:
        """Hold `decision` or release it, with whatever it lets go.

        Args:
            decision: A user's decision, opaque here.
            saw_404: The user's turn saw a 404.
            rejected: The turn ended on a plain 401 (`rejected`).
        """
        if saw_404 and not self.url_proven:
            self._held_404.append(decision)
            return Routed()
        if rejected and self.authenticated == 0:
            self._held_rejected.append(decision)
            return Routed(trip=len(self._held_rejected) >= self.threshold)
        return Routed(release=[*self._release(), decision])

    def finish(self, stopped: StopReason) -> tuple[StopReason, list[T]]:
        """How the pass ends, given how it stopped, and the held decisions to write."""
        if stopped == "completed":
            if self._held_404 and not self.url_proven:
                stopped, self.cause = "breaker", "http_404"
            elif self._held_rejected and self.authenticated == 0:
                stopped, self.cause = "breaker", "plain_401"
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

    def _release(self) -> list[T]:
        released: list[T] = []
        if self._held_rejected:  # an answer other than a plain 401 came
            released, self._held_rejected = self._held_rejected, []
        if self._held_404 and self.url_proven:
            released, self._held_404 = [*released, *self._held_404], []
        return released
