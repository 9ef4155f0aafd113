"""The service's rules as data: pure, no I/O, every function takes `now`.

- the model types that cross every boundary: `UserRow`, `UserUpdate`, `Endpoint`, the
  scopes, the user states and the records storage returns (`_model`);
- `Answer` and `Outcome`, and `classify`, the one parser of an answer and its error body
  (`_outcomes`, `_classify`);
- the per-user state machine `decide_turn` and its table `RULES` (`_policy`); the
  two-phase drop's rules (`_drop`); the pass's circuit breaker `Breaker`, how a pass ends
  (`StopReason`) and its exit codes (`_breaker`); exponential backoff (`_backoff`); the
  capacity plan (`_capacity`); the freshness schedule: a read is due when the delay a
  user's changes accrued reaches the price of a read (the square-root rule for a steady
  rate), stats on change (`_freshness`), the budget's spread over users that sets the price
  (`_spread`), and the change estimate it learns from the reads: `observe` folds a read
  into a `ChangeEstimate`, whose belief is over the rates of `GRID` (`GRID_SIZE` points,
  `DEFAULT_PRIOR` without a population's) (`_estimate`);
- durations as operators write them (`_durations`);
- user state changes as webhook events, with the spec's client action (`_events`).

It imports nothing of lta-worker but `errors` and `secret`; everything else builds on it.
"""

from __future__ import annotations

from lta_worker.domain._backoff import backoff_ceiling, backoff_delay
from lta_worker.domain._breaker import (
    EXIT_CODES,
    TRIP_HINTS,
    Breaker,
    Proof,
    Routed,
    Signal,
    StopReason,
    Trip,
)
from lta_worker.domain._capacity import CapacityPlan, per_hour, plan_capacity
from lta_worker.domain._classify import (
    ALLOWED_CODES,
    OAUTH_CODES,
    classify,
    echoes,
    find_code,
    strict_json,
)
from lta_worker.domain._drop import DROP_START, drop_retry_at, drop_verdict
from lta_worker.domain._durations import format_duration, parse_duration
from lta_worker.domain._estimate import DEFAULT_PRIOR, GRID, GRID_SIZE, ChangeEstimate, observe
from lta_worker.domain._events import (
    CLIENT_ACTIONS,
    EVENT_TYPES,
    EventType,
    OutboxCounts,
    PendingEvent,
    ResultChanged,
    ResultEvents,
    StateEvent,
    change_event,
    enrollment_event,
    turn_events,
)
from lta_worker.domain._freshness import (
    SCHEDULE_MODES,
    STATS_MODES,
    FreshnessConfig,
    ScheduleMode,
    SchedulePlan,
    StatsMode,
    interval_for,
)
from lta_worker.domain._model import (
    ENDPOINT_SCOPES,
    ENDPOINTS,
    LATEST_CHANGE_SCOPE,
    LONG_TERM_SCOPES,
    STATS_SCOPE,
    TOKENLESS_STATES,
    USER_STATES,
    BudgetSeen,
    ChangeFeed,
    EncryptedToken,
    Endpoint,
    HistoryRow,
    InstanceKind,
    InstanceRow,
    PassRecord,
    PendingEnrollment,
    PurgeCounts,
    ReadHealth,
    ResultRow,
    ResultStatus,
    RotationReport,
    SnapshotWrite,
    UserRow,
    UserState,
    UserUpdate,
)
from lta_worker.domain._outcomes import (
    ANSWERED_KINDS,
    FAILED_KINDS,
    OUTCOME_KINDS,
    Answer,
    Outcome,
    OutcomeKind,
    answered_reads,
    canonical_json,
)
from lta_worker.domain._policy import (
    RECHECKED_STATES,
    RULES,
    PolicyConfig,
    authenticated,
    decide_turn,
    endpoints_to_call,
    ends_turn,
    read_again,
    still_wanted,
)
from lta_worker.domain._spread import (
    RATE_CLASSES,
    bucket_rates,
    class_intervals,
    day_shape,
    expected_delay,
    from_buckets,
    plan_scale,
    population_prior,
    rate_class,
)

__all__ = [
    "ALLOWED_CODES",
    "ANSWERED_KINDS",
    "CLIENT_ACTIONS",
    "DEFAULT_PRIOR",
    "DROP_START",
    "ENDPOINTS",
    "ENDPOINT_SCOPES",
    "EVENT_TYPES",
    "EXIT_CODES",
    "FAILED_KINDS",
    "GRID",
    "GRID_SIZE",
    "LATEST_CHANGE_SCOPE",
    "LONG_TERM_SCOPES",
    "OAUTH_CODES",
    "OUTCOME_KINDS",
    "RATE_CLASSES",
    "RECHECKED_STATES",
    "RULES",
    "SCHEDULE_MODES",
    "STATS_MODES",
    "STATS_SCOPE",
    "TOKENLESS_STATES",
    "TRIP_HINTS",
    "USER_STATES",
    "Answer",
    "Breaker",
    "BudgetSeen",
    "CapacityPlan",
    "ChangeEstimate",
    "ChangeFeed",
    "EncryptedToken",
    "Endpoint",
    "EventType",
    "FreshnessConfig",
    "HistoryRow",
    "InstanceKind",
    "InstanceRow",
    "OutboxCounts",
    "Outcome",
    "OutcomeKind",
    "PassRecord",
    "PendingEnrollment",
    "PendingEvent",
    "PolicyConfig",
    "Proof",
    "PurgeCounts",
    "ReadHealth",
    "ResultChanged",
    "ResultEvents",
    "ResultRow",
    "ResultStatus",
    "RotationReport",
    "Routed",
    "ScheduleMode",
    "SchedulePlan",
    "Signal",
    "SnapshotWrite",
    "StateEvent",
    "StatsMode",
    "StopReason",
    "Trip",
    "UserRow",
    "UserState",
    "UserUpdate",
    "answered_reads",
    "authenticated",
    "backoff_ceiling",
    "backoff_delay",
    "bucket_rates",
    "canonical_json",
    "change_event",
    "class_intervals",
    "classify",
    "day_shape",
    "decide_turn",
    "drop_retry_at",
    "drop_verdict",
    "echoes",
    "endpoints_to_call",
    "ends_turn",
    "enrollment_event",
    "expected_delay",
    "find_code",
    "format_duration",
    "from_buckets",
    "interval_for",
    "observe",
    "parse_duration",
    "per_hour",
    "plan_capacity",
    "plan_scale",
    "population_prior",
    "rate_class",
    "read_again",
    "still_wanted",
    "strict_json",
    "turn_events",
]
