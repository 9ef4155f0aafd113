"""What one user's turn changes: a pure state machine over classified outcomes.

Every rule is in `RULES` below, one row per outcome kind, to be read against the spec's
sections 3, 5 and 7 and DESIGN.md "Rules from the spec". The functions under it only fold a
turn's outcomes through the table; they do no I/O and take `now` and the jitter source.

A turn calls the user's endpoints in order (latest-change first) and stops at the first
outcome that ends the turn; results after it therefore never exist. Over 400 lines on
purpose (as h11's state machine): the table and its fold are read together against the spec.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from lta_worker.domain._backoff import backoff_delay
from lta_worker.domain._estimate import ChangeEstimate
from lta_worker.domain._freshness import (
    FreshnessConfig,
    ScheduleMode,
    SchedulePlan,
    StatsMode,
    fold_turn,
    next_due,
    stats_still_wanted,
)
from lta_worker.domain._model import (
    ENDPOINT_SCOPES,
    UNREAD_STATES,
    Endpoint,
    ResultStatus,
    SnapshotWrite,
    UserRow,
    UserState,
    UserUpdate,
)
from lta_worker.domain._outcomes import Outcome, OutcomeKind

Unchanged = Literal["unchanged"]
UNCHANGED: Final[Unchanged] = "unchanged"
TokenAction = Literal["keep", "delete"]
DELETE: Final[TokenAction] = "delete"
FailureAction = Literal["reset", "keep", "add"]
Schedule = Literal["interval", "parked_interval", "backoff", "never", "retry_soon"]
BackoffCap = Literal["interval", "parked_interval"]
# Which setting a user's `next_due_at` derives from, so that a change of `poll.interval` or
# `poll.parked_interval` can reschedule users by class (storage `follow_schedule`):
# `interval` and `parked` are due at last_polled_at + the interval; the backoff classes at
# the earliest of their backoff and last_polled_at + their cap. None: not derived from a
# setting (due now, retry soon, never).
# `adaptive`: set by the freshness schedule (estimate and budget), not by one setting.
DueClass = Literal["interval", "parked", "backoff", "backoff_parked", "adaptive"]
DUE_CLASSES: Final[Mapping[tuple[Schedule, BackoffCap | None], DueClass | None]] = {
    ("interval", None): "interval",
    ("parked_interval", None): "parked",
    ("backoff", "interval"): "backoff",
    ("backoff", "parked_interval"): "backoff_parked",
    ("never", None): None,
    ("retry_soon", None): None,
}


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table: what an outcome does to the user.

    Attributes:
        schedule: `interval`, `parked_interval`, `backoff` (exponential with jitter, capped
            by `backoff_cap`), `never` (no next_due_at) or `retry_soon` (next_due_at
            unchanged: still due, read again when budget allows).
        deny_endpoint: True to skip this endpoint until now + parked_interval.
        authenticated: True when the answer proves the client itself was accepted; the
            circuit breaker counts these.
        read: False when nothing was sent (`last_polled_at` does not move).
        attempts: How many times one read may be sent within a turn while it keeps
            getting this outcome (a 429: the pacer pauses until the reset, then retries).
    """

    state: UserState | Unchanged
    token_action: TokenAction
    snapshot: ResultStatus | None
    ends_turn: bool
    schedule: Schedule
    failures: FailureAction
    deny_endpoint: bool = False
    backoff_cap: BackoffCap | None = None
    authenticated: bool = False
    read: bool = True
    attempts: int = 1


# fmt: off
RULES: Final[Mapping[OutcomeKind, Rule]] = {
    #               state       token     snapshot ends   schedule           failures
    "ok":           Rule("active",   "keep",   "ok",   False, "interval",        "reset",
                         authenticated=True),
    "none":         Rule("active",   "keep",   "none", False, "interval",        "reset",
                         authenticated=True),
    # 403 without a code: this endpoint is not granted; the other is still read.
    "scope_denied": Rule(UNCHANGED,  "keep",   None,   False, "parked_interval", "keep",
                         deny_endpoint=True, authenticated=True),
    # 401 PermanentAccessRevoked: delete the token at once; never due again.
    "revoked":      Rule("revoked",  "delete", None,   True,  "never",           "reset",
                         authenticated=True),
    # 401 NoCloudSyncLinked: keep the token; the user may link cloud sync later.
    "unlinked":     Rule("unlinked", "keep",   None,   True,  "parked_interval", "reset",
                         authenticated=True),
    # 403 CloudSyncInactive: keep the token; access resumes by itself.
    "inactive":     Rule("parked",   "keep",   None,   True,  "parked_interval", "reset",
                         authenticated=True),
    # Plain 401: never a revocation (spec 5.7); backed off, shown to the operator.
    "rejected":     Rule("rejected", "keep",   None,   True,  "backoff",         "add",
                         backoff_cap="parked_interval"),
    # 429: not the user's failure. The read goes again once the pause is over; if the
    # answer is still a 429 the user stays due and is read when the budget allows.
    "rate_limited": Rule(UNCHANGED,  "keep",   None,   True,  "retry_soon",      "keep",
                         attempts=3),
    # 5xx, network, broken body: backed off, never beyond the interval.
    "transient":    Rule(UNCHANGED,  "keep",   None,   True,  "backoff",         "add",
                         backoff_cap="interval"),
    # The stored token does not decrypt (tampered or copied row): nothing is sent; the
    # token is kept (a key file put right makes it readable again), re-checked rarely.
    "undecryptable": Rule(UNCHANGED, "keep",   None,   True,  "parked_interval", "keep",
                          read=False),
}
# fmt: on

# The states whose users are re-checked at `parked_interval` (or backed off up to it): each
# costs one read per re-check, since its first answer ends the turn (the capacity plan).
RECHECKED_STATES: Final[frozenset[UserState]] = frozenset(
    rule.state
    for rule in RULES.values()
    if rule.state != UNCHANGED and "parked_interval" in (rule.schedule, rule.backoff_cap)
)

# Which outcome a turn reports as `last_outcome` when it saw several: the worst, last here.
SEVERITY: Final[tuple[OutcomeKind, ...]] = (
    "ok",
    "none",
    "scope_denied",
    "rate_limited",
    "undecryptable",
    "transient",
    "rejected",
    "inactive",
    "unlinked",
    "revoked",
)
CALL_ORDER: Final[tuple[Endpoint, ...]] = ("latest-change", "stats")
# A backoff is never shorter than this, so a failing user is not re-read in a tight loop.
MIN_RETRY: Final = timedelta(seconds=1)
NOTHING_CALLABLE: Final = "scope_denied"
NO_PLAN: Final = SchedulePlan()


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The durations the policy schedules with: the `[poll]` settings of the same names.

    Built by `PollSettings.policy()`. `interval` also caps the transient backoff (a failure
    never leaves data staler than twice it); `parked_interval` caps the backoff after a
    plain 401; `plan` is the budget's scale for this pass (`_capacity.plan_scale`).
    """

    interval: timedelta
    parked_interval: timedelta
    backoff_base: timedelta
    schedule: ScheduleMode
    max_interval: timedelta
    stats: StatsMode
    stats_max_age: timedelta
    rate_half_life: timedelta
    plan: SchedulePlan = NO_PLAN

    @property
    def freshness(self) -> FreshnessConfig:
        """The freshness schedule's settings."""
        return FreshnessConfig(
            schedule=self.schedule,
            interval=self.interval,
            max_interval=max(self.max_interval, self.interval),
            stats=self.stats,
            stats_max_age=self.stats_max_age,
            rate_half_life=self.rate_half_life,
        )


def ends_turn(outcome: Outcome) -> bool:
    """True when no further endpoint of the user may be called after this outcome."""
    return RULES[outcome.kind].ends_turn


def authenticated(outcome: Outcome) -> bool:
    """True when the answer proves the client was accepted (both halves of the credential).

    A 404 proves nothing of the credential: a wrong URL answers it unauthenticated.
    """
    return RULES[outcome.kind].authenticated and outcome.status != 404


def read_again(outcome: Outcome, attempt: int) -> bool:
    """True when the read that came to `outcome` on its `attempt`-th sending goes again."""
    return attempt < RULES[outcome.kind].attempts


def endpoints_to_call(
    user: UserRow, client_scopes: Sequence[str], now: datetime
) -> tuple[Endpoint, ...]:
    """The endpoints to read in this turn, in call order (latest-change first).

    An endpoint is called only when the user granted its scope at enrollment, the client
    configuration still lists it, and it is not marked denied until after `now`. A user
    without a token (revoked, dropped) has nothing to call.
    """
    if user.token is None or user.state in UNREAD_STATES:
        return ()
    return tuple(
        endpoint
        for endpoint in CALL_ORDER
        if user.granted(endpoint)
        and ENDPOINT_SCOPES[endpoint] in client_scopes
        and not _denied_at(user.denied, endpoint, now)
    )


def still_wanted(
    user: UserRow,
    endpoint: Endpoint,
    results: Sequence[tuple[Endpoint | None, Outcome]],
    now: datetime,
    cfg: PolicyConfig,
) -> bool:
    """Whether `endpoint` is still read in this turn after `results` (`poll.stats`).

    Stats is skipped under `on_change` when latest-change's content did not change and
    stats is younger than `stats_max_age`; latest-change is always read.
    """
    if endpoint != "stats":
        return True
    turn = [(e, o.kind, o.canonical()) for e, o in results if e is not None]
    return stats_still_wanted(user.estimate, turn, now, cfg.freshness)


def decide_turn(
    user: UserRow,
    results: Sequence[tuple[Endpoint | None, Outcome]],
    now: datetime,
    cfg: PolicyConfig,
    rng: random.Random,
) -> UserUpdate:
    """Fold one turn's outcomes through `RULES` into the update to write.

    `results` are (endpoint, outcome) in call order; anything after the first outcome that
    ends the turn is ignored, and the endpoint is None for an outcome reached before any
    request (`undecryptable`). With no result at all (nothing was callable), only the
    schedule moves: to the earliest denied retry, at the latest `parked_interval` from now.
    """
    turn = _until_end(results)
    denied = {name: until for name, until in user.denied.items() if until > now}
    if not turn:
        retry = min([*denied.values(), now + cfg.parked_interval])
        return UserUpdate(
            user_id=user.id,
            state=user.state,
            next_due_at=retry,
            consecutive_failures=user.consecutive_failures,
            last_outcome=NOTHING_CALLABLE,
            last_polled_at=user.last_polled_at,
            denied=denied,
            generation=user.generation,
        )
    state: UserState = user.state
    failures = user.consecutive_failures
    snapshots: list[SnapshotWrite] = []
    delete_token = False
    read = any(RULES[outcome.kind].read for _, outcome in turn)
    for endpoint, outcome in turn:
        rule = RULES[outcome.kind]
        if rule.state != UNCHANGED:
            state = rule.state
        failures = _failures(rule.failures, failures)
        delete_token = delete_token or rule.token_action == DELETE
        if rule.snapshot is not None and endpoint is not None:
            at = outcome.at or now
            if rule.snapshot == "ok":
                snapshot = SnapshotWrite(endpoint, "ok", outcome.payload, at, outcome.content)
            else:
                snapshot = SnapshotWrite(endpoint, rule.snapshot, None, at)
            snapshots.append(snapshot)
            denied.pop(endpoint, None)  # it answered: it is granted after all
        if rule.deny_endpoint and endpoint is not None:
            denied[endpoint] = now + cfg.parked_interval
    worst = max((outcome for _, outcome in turn), key=lambda o: SEVERITY.index(o.kind))
    # What was read feeds the change estimate; an outcome with nothing sent has nothing.
    answers = [(e, o.kind, o.canonical()) for e, o in turn if e is not None]
    estimate = fold_turn(user.estimate, answers, now, cfg.freshness, cfg.plan.prior)
    due = _next_due(user, turn, failures=failures, now=now, cfg=cfg, rng=rng, estimate=estimate)
    return UserUpdate(
        user_id=user.id,
        state=state,
        next_due_at=due,
        consecutive_failures=failures,
        last_outcome=worst.kind,
        last_code=worst.code,
        last_polled_at=now if read else user.last_polled_at,
        delete_token=delete_token,
        denied=denied,
        snapshots=tuple(snapshots),
        generation=user.generation,
        due_class=_due_class(turn, cfg) if read else None,
        estimate=estimate,
    )


def _due_class(
    turn: Sequence[tuple[Endpoint | None, Outcome]], cfg: PolicyConfig
) -> DueClass | None:
    """Which setting the turn's `next_due_at` derives from (see `DUE_CLASSES`)."""
    last = RULES[turn[-1][1].kind]
    if last.ends_turn:
        return DUE_CLASSES[(last.schedule, last.backoff_cap)]
    # Without an ending outcome the soonest schedule wins (see `_next_due`); the outcomes
    # that do not end a turn are scheduled at `interval` or `parked_interval` only.
    schedules = {RULES[o.kind].schedule for _, o in turn}
    if "interval" in schedules and (
        "parked_interval" not in schedules or cfg.interval <= cfg.parked_interval
    ):
        return "adaptive" if cfg.schedule == "adaptive" else "interval"
    return "parked"


def _until_end(
    results: Sequence[tuple[Endpoint | None, Outcome]],
) -> list[tuple[Endpoint | None, Outcome]]:
    turn: list[tuple[Endpoint | None, Outcome]] = []
    for endpoint, outcome in results:
        turn.append((endpoint, outcome))
        if ends_turn(outcome):
            break
    return turn


def _failures(action: FailureAction, failures: int) -> int:
    if action == "reset":
        return 0
    if action == "add":
        return max(failures, 0) + 1
    return failures


def _next_due(
    user: UserRow,
    turn: Sequence[tuple[Endpoint | None, Outcome]],
    *,
    failures: int,
    now: datetime,
    cfg: PolicyConfig,
    rng: random.Random,
    estimate: ChangeEstimate | None = None,
) -> datetime | None:
    """The ending outcome's schedule; without one, the soonest of the outcomes' schedules."""
    last = RULES[turn[-1][1].kind]
    if last.ends_turn:
        return _schedule(last, user, failures=failures, now=now, cfg=cfg, rng=rng)
    due = [
        _schedule(
            RULES[o.kind], user, failures=failures, now=now, cfg=cfg, rng=rng, estimate=estimate
        )
        for _, o in turn
    ]
    return min(d for d in due if d is not None)


def _schedule(
    rule: Rule,
    user: UserRow,
    *,
    failures: int,
    now: datetime,
    cfg: PolicyConfig,
    rng: random.Random,
    estimate: ChangeEstimate | None = None,
) -> datetime | None:
    if rule.schedule == "interval":
        if cfg.schedule == "fixed":
            return now + cfg.interval
        return next_due(estimate, now, cfg.plan, cfg.freshness)
    if rule.schedule == "parked_interval":
        return now + cfg.parked_interval
    if rule.schedule == "never":
        return None
    if rule.schedule == "retry_soon":
        return user.next_due_at if user.next_due_at is not None else now
    cap = cfg.parked_interval if rule.backoff_cap == "parked_interval" else cfg.interval
    delay = backoff_delay(failures, base=cfg.backoff_base, cap=cap, rng=rng)
    return now + min(max(delay, MIN_RETRY), cap)


def _denied_at(denied: Mapping[str, datetime], endpoint: Endpoint, now: datetime) -> bool:
    until = denied.get(endpoint)
    return until is not None and until > now
