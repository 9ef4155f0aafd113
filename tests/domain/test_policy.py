"""The per-user policy: one test per row of the table, then the combinations of a turn."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.config import PollSettings
from lta_worker.domain import (
    OUTCOME_KINDS,
    RULES,
    USER_STATES,
    EncryptedToken,
    Endpoint,
    Outcome,
    SnapshotWrite,
    UserRow,
    UserState,
    authenticated,
    decide_turn,
    drop_retry_at,
    drop_verdict,
    endpoints_to_call,
    ends_turn,
    read_again,
)
from lta_worker.domain._drop import DROP_START
from lta_worker.domain._outcomes import OutcomeKind
from lta_worker.protocol import LATEST_CHANGE_SCOPE, STATS_SCOPE

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CFG = PollSettings(
    schedule="fixed",
    stats="always",
    interval=timedelta(hours=1),
    parked_interval=timedelta(hours=24),
    backoff_base=timedelta(seconds=30),
).policy()
BOTH = (LATEST_CHANGE_SCOPE, STATS_SCOPE)
LATEST: Endpoint = "latest-change"
STATS: Endpoint = "stats"


def make_user(**changes: object) -> UserRow:
    """An active user with both scopes, due now, who has never failed."""
    user = UserRow(
        id=7,
        user="u-7",
        state="active",
        token=EncryptedToken(b"\x00" * 40, "k1"),
        scopes=BOTH,
        denied={},
        enrolled_at=NOW - timedelta(days=3),
        last_polled_at=NOW - timedelta(hours=1),
        next_due_at=NOW - timedelta(minutes=1),
        consecutive_failures=0,
        last_outcome="ok",
        last_code=None,
    )
    return replace(user, **changes)  # type: ignore[arg-type]


def out(kind: OutcomeKind, **fields: object) -> Outcome:
    """An outcome of `kind`, with a payload for ok and the usual code for coded rows."""
    codes = {
        "revoked": "PermanentAccessRevoked",
        "unlinked": "NoCloudSyncLinked",
        "inactive": "CloudSyncInactive",
    }
    defaults: dict[str, object] = {"code": codes.get(kind)}
    if kind == "ok":
        defaults["payload"] = {"v": 1}
    if kind == "rate_limited":
        defaults["wait"] = 30.0
    return Outcome(kind, **{**defaults, **fields})  # type: ignore[arg-type]


def rng() -> random.Random:
    return random.Random(1234)


# -- one test per row ----------------------------------------------------------------------


class Row(NamedTuple):
    """What one outcome alone does to an active user with two failures behind them."""

    kind: OutcomeKind
    state: UserState
    delete: bool
    snapshot: str | None
    failures: int
    due: datetime | str | None  # "backoff": somewhere up to the row's cap
    due_class: str | None  # the setting next_due_at derives from, to follow its changes


PARKED = NOW + CFG.parked_interval
ROWS = [
    Row("ok", "active", False, "ok", 0, NOW + CFG.interval, "interval"),
    Row("none", "active", False, "none", 0, NOW + CFG.interval, "interval"),
    Row("revoked", "revoked", True, None, 0, None, None),
    Row("unlinked", "unlinked", False, None, 0, PARKED, "parked"),
    Row("inactive", "parked", False, None, 0, PARKED, "parked"),
    Row("scope_denied", "active", False, None, 2, PARKED, "parked"),
    Row("rejected", "rejected", False, None, 3, "backoff", "backoff_parked"),
    Row("rate_limited", "active", False, None, 2, NOW - timedelta(minutes=1), None),
    Row("transient", "active", False, None, 3, "backoff", "backoff"),
]


@pytest.mark.parametrize("row", [pytest.param(row, id=row.kind) for row in ROWS])
def test_row(row: Row) -> None:
    """A turn with one outcome applies exactly its row of the table."""
    user = make_user(consecutive_failures=2, scopes=(LATEST_CHANGE_SCOPE,), generation=41)
    update = decide_turn(user, [(LATEST, out(row.kind))], NOW, CFG, rng())
    assert (update.user_id, update.generation) == (user.id, 41)  # fenced by the claim's
    assert update.state == row.state
    assert update.delete_token is row.delete
    assert [s.status for s in update.snapshots] == ([row.snapshot] if row.snapshot else [])
    assert update.consecutive_failures == row.failures
    assert update.last_outcome == row.kind
    assert update.last_code == out(row.kind).code
    assert update.last_polled_at == NOW
    assert update.due_class == row.due_class
    if row.due == "backoff":
        assert update.next_due_at is not None
        cap = CFG.parked_interval if row.kind == "rejected" else CFG.interval
        assert NOW < update.next_due_at <= NOW + cap
    else:
        assert update.next_due_at == row.due


def test_undecryptable_row_keeps_everything_and_rechecks_at_the_parked_interval() -> None:
    """A token that does not decrypt: nothing sent or changed, re-checked when parked."""
    user = make_user(consecutive_failures=2, state="unlinked")
    update = decide_turn(user, [(None, out("undecryptable"))], NOW, CFG, rng())
    assert (update.state, update.delete_token, update.snapshots) == ("unlinked", False, ())
    assert (update.consecutive_failures, update.last_outcome) == (2, "undecryptable")
    assert update.last_polled_at == user.last_polled_at
    assert update.next_due_at == NOW + CFG.parked_interval
    assert update.due_class is None


AUTHENTICATED = {"ok", "none", "scope_denied", "revoked", "unlinked", "inactive"}


@pytest.mark.parametrize(("kind", "status"), [*[(kind, 200) for kind in RULES], ("none", 404)])
def test_authenticated_column(kind: OutcomeKind, status: int) -> None:
    """Only answers that need both halves of the credential prove the client; a 404 never."""
    assert authenticated(out(kind, status=status)) is (kind in AUTHENTICATED and status != 404)


@pytest.mark.parametrize(
    ("kind", "attempt", "again"),
    [
        ("rate_limited", 1, True),
        ("rate_limited", 2, True),
        ("rate_limited", 3, False),
        *[(kind, 1, False) for kind in RULES if kind != "rate_limited"],
    ],
)
def test_read_again_row(kind: OutcomeKind, attempt: int, again: bool) -> None:
    """Only a 429 sends the same read again within the turn, three sendings at most."""
    assert read_again(out(kind), attempt) is again


def test_table_covers_every_outcome_kind() -> None:
    """Every outcome kind has exactly one row."""
    assert set(RULES) == set(OUTCOME_KINDS)


@pytest.mark.parametrize(
    ("kind", "ends"),
    [pytest.param(kind, kind not in {"ok", "none", "scope_denied"}, id=kind) for kind in RULES],
)
def test_ends_turn(kind: OutcomeKind, ends: bool) -> None:
    """Only ok, none and scope_denied let the turn go on to the other endpoint."""
    assert ends_turn(out(kind)) is ends


# -- combinations of a turn ------------------------------------------------------------------


def test_ok_and_scope_denied_keep_the_good_endpoint_on_the_interval() -> None:
    """latest-change ok + stats 403: snapshot kept, stats denied, due at the interval."""
    update = decide_turn(
        make_user(), [(LATEST, out("ok")), (STATS, out("scope_denied"))], NOW, CFG, rng()
    )
    assert update.state == "active"
    assert update.snapshots == (SnapshotWrite(LATEST, "ok", {"v": 1}, NOW),)
    assert update.denied == {STATS: NOW + CFG.parked_interval}
    assert (update.next_due_at, update.due_class) == (NOW + CFG.interval, "interval")
    assert update.last_outcome == "scope_denied"


def test_ok_then_transient_keeps_the_snapshot_and_backs_off() -> None:
    """latest-change ok + stats 503: the snapshot is written, one failure, short backoff."""
    user = make_user(consecutive_failures=4)
    update = decide_turn(user, [(LATEST, out("ok")), (STATS, out("transient"))], NOW, CFG, rng())
    assert [s.endpoint for s in update.snapshots] == [LATEST]
    assert update.consecutive_failures == 1  # the success reset it, then one failure
    assert update.next_due_at is not None
    assert NOW < update.next_due_at <= NOW + CFG.backoff_base
    assert update.last_outcome == "transient"


@pytest.mark.parametrize("state", ["parked", "unlinked", "rejected"])
def test_success_brings_a_user_back_to_active(state: UserState) -> None:
    """Parked, unlinked and rejected users become active again on their own after an ok."""
    user = make_user(state=state, consecutive_failures=6)
    update = decide_turn(user, [(LATEST, out("none")), (STATS, out("ok"))], NOW, CFG, rng())
    assert (update.state, update.consecutive_failures) == ("active", 0)
    assert update.next_due_at == NOW + CFG.interval


@pytest.mark.parametrize("due", [NOW - timedelta(minutes=1), None])
def test_rate_limited_after_ok_keeps_the_user_due(due: datetime | None) -> None:
    """A 429 is no failure: the user stays due (now if never due) to be read again soon."""
    user = make_user(next_due_at=due)
    update = decide_turn(user, [(LATEST, out("ok")), (STATS, out("rate_limited"))], NOW, CFG, rng())
    assert (update.next_due_at, update.consecutive_failures) == (due or NOW, 0)
    assert len(update.snapshots) == 1


def test_both_denied_waits_for_parked_interval() -> None:
    """403 on both endpoints: both denied, the user re-checked after parked_interval."""
    results = [(LATEST, out("scope_denied")), (STATS, out("scope_denied"))]
    update = decide_turn(make_user(), results, NOW, CFG, rng())
    assert update.denied == {LATEST: NOW + CFG.parked_interval, STATS: NOW + CFG.parked_interval}
    assert update.next_due_at == NOW + CFG.parked_interval
    assert update.state == "active"


def test_answered_endpoint_is_no_longer_denied() -> None:
    """An endpoint that answers leaves the denied map; expired entries are dropped."""
    user = make_user(denied={STATS: NOW - timedelta(seconds=1), LATEST: NOW - timedelta(hours=1)})
    update = decide_turn(user, [(LATEST, out("ok")), (STATS, out("ok"))], NOW, CFG, rng())
    assert update.denied == {}


def test_nothing_callable_schedules_the_earliest_denied_retry() -> None:
    """With every endpoint denied, the user is due when the first denial expires."""
    soon = NOW + timedelta(hours=2)
    user = make_user(denied={LATEST: soon, STATS: NOW + timedelta(hours=5)}, generation=41)
    assert endpoints_to_call(user, BOTH, NOW) == ()
    update = decide_turn(user, [], NOW, CFG, rng())
    assert (update.next_due_at, update.generation) == (soon, 41)
    assert (update.state, update.consecutive_failures) == ("active", 0)
    assert update.last_polled_at == user.last_polled_at
    assert update.snapshots == ()
    assert not update.delete_token


def test_nothing_granted_waits_parked_interval() -> None:
    """A user whose scopes the client no longer calls is re-checked at parked_interval."""
    user = make_user(scopes=(STATS_SCOPE,))
    assert endpoints_to_call(user, (LATEST_CHANGE_SCOPE,), NOW) == ()
    update = decide_turn(user, [], NOW, CFG, rng())
    assert update.next_due_at == NOW + CFG.parked_interval


# -- which endpoints are called ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "client", "expected"),
    [
        pytest.param({}, BOTH, (LATEST, STATS), id="both-latest-first"),
        pytest.param({"scopes": BOTH[::-1]}, BOTH, (LATEST, STATS), id="order"),
        pytest.param({"scopes": (STATS_SCOPE,)}, BOTH, (STATS,), id="user-granted-stats-only"),
        pytest.param({}, (LATEST_CHANGE_SCOPE,), (LATEST,), id="client-dropped-stats"),
        pytest.param({"denied": {STATS: NOW + timedelta(hours=1)}}, BOTH, (LATEST,), id="denied"),
        pytest.param({"denied": {STATS: NOW}}, BOTH, (LATEST, STATS), id="denial-expired-now"),
        pytest.param({"scopes": ()}, BOTH, (), id="nothing-granted"),
        *[pytest.param({"state": s}, BOTH, (), id=s) for s in ("revoked", "dropping", "dropped")],
        pytest.param({"token": None}, BOTH, (), id="no-token"),
    ],
)
def test_endpoints_to_call(
    user: dict[str, object], client: tuple[str, ...], expected: tuple[Endpoint, ...]
) -> None:
    """Only endpoints granted by the user and the client, and not denied, are called; never
    a tokenless user's (revoked, dropping: token kept only for the DELETE, dropped)."""
    assert endpoints_to_call(make_user(**user), client, NOW) == expected


# -- properties -----------------------------------------------------------------------------

kinds = st.sampled_from(OUTCOME_KINDS)


@given(
    kind=st.sampled_from(["transient", "rejected"]),
    failures=st.integers(min_value=0, max_value=10_000),
    state=st.sampled_from([s for s in USER_STATES if s not in {"revoked", "dropped"}]),
    seed=st.integers(),
)
def test_a_failure_is_retried_within_its_cap_whatever_the_count(
    kind: OutcomeKind, failures: int, state: UserState, seed: int
) -> None:
    """A transient failure is retried within one interval; a plain 401 keeps the token and
    is retried within a parked interval."""
    user = make_user(state=state, consecutive_failures=failures)
    update = decide_turn(user, [(LATEST, out(kind))], NOW, CFG, random.Random(seed))
    cap = CFG.interval if kind == "transient" else CFG.parked_interval
    assert update.next_due_at is not None
    assert NOW < update.next_due_at <= NOW + cap
    assert update.state == (state if kind == "transient" else "rejected")
    assert (update.consecutive_failures, update.delete_token) == (failures + 1, False)


@given(first=kinds, second=kinds, seed=st.integers())
def test_any_turn_gives_a_consistent_update(
    first: OutcomeKind, second: OutcomeKind, seed: int
) -> None:
    """Any two outcomes fold to an update that follows the table; a result after one that
    ends the turn (revoked first: stats never called) is ignored."""
    results = [(LATEST, out(first)), (STATS, out(second))]
    update = decide_turn(make_user(), results, NOW, CFG, random.Random(seed))
    turn = results[:1] if RULES[first].ends_turn else results
    read = [endpoint for endpoint, o in turn if o.kind in {"ok", "none"}]
    assert [s.endpoint for s in update.snapshots] == read
    assert update.delete_token is any(o.kind == "revoked" for _, o in turn)
    assert update.delete_token is (update.state == "revoked")
    assert (update.next_due_at is None) is (turn[-1][1].kind == "revoked")
    if update.next_due_at is not None and turn[-1][1].kind != "rate_limited":
        assert NOW < update.next_due_at <= NOW + CFG.parked_interval
    assert update.last_outcome in {o.kind for _, o in turn}


# -- the two-phase drop (state `dropping`) ---------------------------------------------------


def test_drop_start_table() -> None:
    """`users drop`/`forget` move a token holder to `dropping`; a tokenless user is left as is."""
    table = {s: "unchanged" if s in {"revoked", "dropped"} else "dropping" for s in USER_STATES}
    assert table == DROP_START


@pytest.mark.parametrize(
    ("status", "code", "verdict"),
    [
        pytest.param(204, None, "confirmed", id="204"),
        pytest.param(200, None, "confirmed", id="other-2xx"),
        pytest.param(401, "PermanentAccessRevoked", "confirmed", id="401-revoked"),
        pytest.param(401, None, "refused", id="401-plain"),
        pytest.param(401, "NoCloudSyncLinked", "refused", id="401-other-code"),
        pytest.param(None, None, "retry", id="no-answer"),
        pytest.param(500, None, "retry", id="5xx"),
        pytest.param(404, None, "retry", id="404"),
        pytest.param(429, None, "retry", id="429"),
        pytest.param(403, None, "retry", id="403"),
    ],
)
def test_drop_verdict_row(status: int | None, code: str | None, verdict: str) -> None:
    """Only a 2xx or a revocation confirms a drop; anything else keeps it pending."""
    assert drop_verdict(status, code) == verdict


@given(failures=st.integers(min_value=1, max_value=10_000), seed=st.integers())
def test_a_drop_retry_is_never_later_than_the_interval(failures: int, seed: int) -> None:
    """A pending drop is retried at least once per `poll.interval`, never in a tight loop."""
    when = drop_retry_at(failures, NOW, CFG, random.Random(seed))
    assert NOW + timedelta(seconds=1) <= when <= NOW + CFG.interval
