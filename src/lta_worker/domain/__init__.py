"""The service's rules as data: pure, no I/O, every function takes `now`.

- the model types that cross every boundary: `UserRow`, `UserUpdate`, `Endpoint`, the
  scopes, the user states and the records storage returns (`_model`);
- `Answer` and `Outcome`, and `classify`, the one parser of an answer and its error body
  (`_outcomes`, `_classify`);
- the per-user state machine `decide_turn` and its table `RULES`, and the drop rules
  (`_policy`); exponential backoff (`_backoff`); the capacity plan (`_capacity`);
- durations as operators write them (`_durations`);
- user state changes as webhook events, with the spec's client action (`_events`).

It imports nothing of lta-worker but `errors` and `secret`; everything else builds on it.
"""

from __future__ import annotations

from lta_worker.domain._backoff import backoff_ceiling, backoff_delay
from lta_worker.domain._capacity import CapacityPlan, plan_capacity
from lta_worker.domain._classify import ALLOWED_CODES, OAUTH_CODES, classify, find_code, strict_json
from lta_worker.domain._durations import format_duration, parse_duration
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
    decide_turn,
    drop_retry_at,
    drop_verdict,
    endpoints_to_call,
    ends_turn,
)

__all__ = [
    "ALLOWED_CODES",
    "CLIENT_ACTIONS",
    "ENDPOINTS",
    "ENDPOINT_SCOPES",
    "EVENT_TYPES",
    "LATEST_CHANGE_SCOPE",
    "LONG_TERM_SCOPES",
    "OAUTH_CODES",
    "OUTCOME_KINDS",
    "RULES",
    "STATS_SCOPE",
    "TOKENLESS_STATES",
    "USER_STATES",
    "Answer",
    "BudgetSeen",
    "CapacityPlan",
    "EncryptedToken",
    "Endpoint",
    "EventType",
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
    "SnapshotWrite",
    "StateEvent",
    "UserRow",
    "UserState",
    "UserUpdate",
    "backoff_ceiling",
    "backoff_delay",
    "change_event",
    "classify",
    "decide_turn",
    "drop_retry_at",
    "drop_verdict",
    "endpoints_to_call",
    "ends_turn",
    "enrollment_event",
    "find_code",
    "format_duration",
    "parse_duration",
    "plan_capacity",
    "strict_json",
    "turn_events",
]
