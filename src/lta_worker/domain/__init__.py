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
  (`_spread`), and the change estimate it learns from the reads (`_estimate`);
- durations as operators write them (`_durations`);
- user state changes as webhook events, with the spec's client action (`_events`).

It imports nothing of lta-worker but `errors` and `secret`; everything else builds on it.
Names are imported on first use (see `lta_worker._lazy`): `status` needs the model, the
capacity plan and the durations, not the policy table or the classifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lta_worker._lazy import lazy_attributes

if TYPE_CHECKING:
    from lta_worker.domain._backoff import backoff_ceiling, backoff_delay
    from lta_worker.domain._breaker import EXIT_CODES, Breaker, Routed, Signal, StopReason, Trip
    from lta_worker.domain._capacity import CapacityPlan, plan_capacity
    from lta_worker.domain._classify import (
        ALLOWED_CODES,
        OAUTH_CODES,
        classify,
        find_code,
        strict_json,
    )
    from lta_worker.domain._drop import DROP_START, drop_retry_at, drop_verdict
    from lta_worker.domain._durations import format_duration, parse_duration
    from lta_worker.domain._estimate import ChangeEstimate
    from lta_worker.domain._events import (
        CLIENT_ACTIONS,
        EVENT_TYPES,
        EventType,
        OutboxCounts,
        PendingEvent,
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
        EncryptedToken,
        Endpoint,
        HistoryRow,
        InstanceKind,
        InstanceRow,
        PassRecord,
        PendingEnrollment,
        PurgeCounts,
        ResultRow,
        ResultStatus,
        RotationReport,
        SnapshotWrite,
        UserRow,
        UserState,
        UserUpdate,
    )
    from lta_worker.domain._outcomes import OUTCOME_KINDS, Answer, Outcome, OutcomeKind
    from lta_worker.domain._policy import (
        RULES,
        PolicyConfig,
        PollDurations,
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
        from_buckets,
        plan_scale,
        rate_class,
    )

_NAMES = {
    "backoff_ceiling": "._backoff",
    "backoff_delay": "._backoff",
    "EXIT_CODES": "._breaker",
    "Breaker": "._breaker",
    "Routed": "._breaker",
    "Signal": "._breaker",
    "StopReason": "._breaker",
    "Trip": "._breaker",
    "CapacityPlan": "._capacity",
    "plan_capacity": "._capacity",
    "ALLOWED_CODES": "._classify",
    "OAUTH_CODES": "._classify",
    "classify": "._classify",
    "find_code": "._classify",
    "strict_json": "._classify",
    "DROP_START": "._drop",
    "drop_retry_at": "._drop",
    "drop_verdict": "._drop",
    "format_duration": "._durations",
    "parse_duration": "._durations",
    "ChangeEstimate": "._estimate",
    "CLIENT_ACTIONS": "._events",
    "EVENT_TYPES": "._events",
    "EventType": "._events",
    "OutboxCounts": "._events",
    "PendingEvent": "._events",
    "StateEvent": "._events",
    "change_event": "._events",
    "enrollment_event": "._events",
    "turn_events": "._events",
    "RATE_CLASSES": "._spread",
    "SCHEDULE_MODES": "._freshness",
    "STATS_MODES": "._freshness",
    "FreshnessConfig": "._freshness",
    "ScheduleMode": "._freshness",
    "SchedulePlan": "._freshness",
    "StatsMode": "._freshness",
    "bucket_rates": "._spread",
    "class_intervals": "._spread",
    "day_shape": "._spread",
    "from_buckets": "._spread",
    "interval_for": "._freshness",
    "plan_scale": "._spread",
    "rate_class": "._spread",
    "ENDPOINT_SCOPES": "._model",
    "ENDPOINTS": "._model",
    "LATEST_CHANGE_SCOPE": "._model",
    "LONG_TERM_SCOPES": "._model",
    "STATS_SCOPE": "._model",
    "TOKENLESS_STATES": "._model",
    "USER_STATES": "._model",
    "BudgetSeen": "._model",
    "EncryptedToken": "._model",
    "Endpoint": "._model",
    "HistoryRow": "._model",
    "InstanceKind": "._model",
    "InstanceRow": "._model",
    "PassRecord": "._model",
    "PendingEnrollment": "._model",
    "PurgeCounts": "._model",
    "ResultRow": "._model",
    "ResultStatus": "._model",
    "RotationReport": "._model",
    "SnapshotWrite": "._model",
    "UserRow": "._model",
    "UserState": "._model",
    "UserUpdate": "._model",
    "OUTCOME_KINDS": "._outcomes",
    "Answer": "._outcomes",
    "Outcome": "._outcomes",
    "OutcomeKind": "._outcomes",
    "RULES": "._policy",
    "PolicyConfig": "._policy",
    "PollDurations": "._policy",
    "authenticated": "._policy",
    "decide_turn": "._policy",
    "endpoints_to_call": "._policy",
    "ends_turn": "._policy",
    "read_again": "._policy",
    "still_wanted": "._policy",
}
__getattr__ = lazy_attributes(__name__, _NAMES)

__all__ = [
    "ALLOWED_CODES",
    "CLIENT_ACTIONS",
    "DROP_START",
    "ENDPOINTS",
    "ENDPOINT_SCOPES",
    "EVENT_TYPES",
    "EXIT_CODES",
    "LATEST_CHANGE_SCOPE",
    "LONG_TERM_SCOPES",
    "OAUTH_CODES",
    "OUTCOME_KINDS",
    "RATE_CLASSES",
    "RULES",
    "SCHEDULE_MODES",
    "STATS_MODES",
    "STATS_SCOPE",
    "TOKENLESS_STATES",
    "USER_STATES",
    "Answer",
    "Breaker",
    "BudgetSeen",
    "CapacityPlan",
    "ChangeEstimate",
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
    "PollDurations",
    "PurgeCounts",
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
    "authenticated",
    "backoff_ceiling",
    "backoff_delay",
    "bucket_rates",
    "change_event",
    "class_intervals",
    "classify",
    "day_shape",
    "decide_turn",
    "drop_retry_at",
    "drop_verdict",
    "endpoints_to_call",
    "ends_turn",
    "enrollment_event",
    "find_code",
    "format_duration",
    "from_buckets",
    "interval_for",
    "parse_duration",
    "plan_capacity",
    "plan_scale",
    "rate_class",
    "read_again",
    "still_wanted",
    "strict_json",
    "turn_events",
]
