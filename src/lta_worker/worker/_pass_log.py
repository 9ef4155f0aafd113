"""The log lines of a pass (docs/log-events.md): one function per event, so that the engine
says what happened and this module says how it is written."""

from __future__ import annotations

from typing import Any

from lta_worker.domain import TRIP_HINTS, Breaker, Endpoint, Outcome, UserRow, UserUpdate
from lta_worker.logs import get_logger
from lta_worker.pacing import PacerSnapshot

log = get_logger("lta_worker.engine")


def pass_logger() -> Any:
    """The logger of one pass's `poll.read` lines, bound once as logging is configured now
    (the module's `log` is a proxy that binds anew at every line: a tenth of the line's
    cost, paid at every read)."""
    return log.bind()


def read(
    per_pass: Any,
    user: UserRow,
    endpoint: Endpoint,
    outcome: Outcome,
    took: float,
    *,
    budget: PacerSnapshot,
) -> None:
    """`poll.read` (through `per_pass`, `pass_logger`), and `ratelimit.throttled` after a 429."""
    per_pass.info(
        "poll.read",
        user=user.user,
        endpoint=endpoint,
        status=outcome.status,
        outcome=outcome.kind,
        code=outcome.code,
        reason=outcome.reason,
        duration_ms=round(took * 1000, 1),
        budget_remaining=budget.remaining,
        budget_limit=budget.limit,
        budget_reset_s=None if budget.reset_in is None else round(budget.reset_in, 1),
    )
    if outcome.kind == "rate_limited":
        log.warning(
            "ratelimit.throttled", user=user.user, endpoint=endpoint, retry_after_s=outcome.wait
        )


def changes(user: UserRow, update: UserUpdate) -> None:
    """`user.state_changed`, `token.deleted` and `endpoint.denied` for a decision written."""
    if update.state != user.state:
        level = "warning" if update.state in {"revoked", "rejected"} else "info"
        getattr(log, level)(
            "user.state_changed",
            user=user.user,
            **{"from": user.state, "to": update.state},
            reason=update.last_outcome,
        )
    if update.delete_token:
        log.warning("token.deleted", user=user.user, reason=update.state)
    for endpoint, until in update.denied.items():
        if endpoint not in user.denied:
            log.warning("endpoint.denied", user=user.user, endpoint=endpoint, retry_at=until)


def undecryptable(user: UserRow) -> None:
    """`token.undecryptable`: a stored token that does not decrypt (tampered or copied)."""
    log.error(
        "token.undecryptable",
        user=user.user,
        key_id=None if user.token is None else user.token.key_id,
    )


def unsendable(user: UserRow) -> None:
    """`token.unsendable`: a stored token an Authorization header cannot carry."""
    log.error(
        "token.unsendable",
        user=user.user,
        hint="the token holds a space, a control character or a character beyond ASCII "
        "(stored before enrollment refused such tokens); enroll the user again",
    )


def discarded(user: str, reason: str, outcome: str) -> None:
    """`poll.discarded`: a decision not written (`changed` since the claim, or `failed`)."""
    log.warning("poll.discarded", user=user, reason=reason, outcome=outcome)


def breaker(instance: str, breaker: Breaker[Any], rejected: int) -> None:
    """`pass.breaker_tripped`: its cause, what proved it, and the hint for the cause."""
    log.error(
        "pass.breaker_tripped",
        instance=instance,
        cause=breaker.cause,
        proof="service" if breaker.proven else "users",
        rejected=rejected,
        hint=TRIP_HINTS[breaker.cause],
    )


def unreachable(instance: str, reads: int) -> None:
    """`pass.unreachable`: no read of the pass got any answer."""
    log.error(
        "pass.unreachable",
        instance=instance,
        reads=reads,
        hint="no read got any answer (network failures only): the service is unreachable "
        "from here, or service.base_url names the wrong host; the users tried are backed off "
        "(a failure counted, read again within poll.interval), the others stay due",
    )


def lease_lapsed(instance: str, users: int) -> None:
    """`pass.lease_lapsed`: turns given up because their lease may have lapsed."""
    log.warning(
        "pass.lease_lapsed",
        instance=instance,
        users=users,
        hint="the lease renewals did not reach the database in time (a stalled or slow "
        "database): these users were not read, so that no other instance reads them too; "
        "they stay due",
    )
