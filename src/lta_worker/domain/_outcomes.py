"""What a read can come to: the raw answer from the wire, and its classified outcome.

Pure data; `classify` turns an `Answer` into an `Outcome`, `policy` turns outcomes into
decisions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

OutcomeKind = Literal[
    "ok",
    "none",
    "revoked",
    "unlinked",
    "inactive",
    "scope_denied",
    "rejected",
    "rate_limited",
    "transient",
    # Not an answer: the stored token could not be decrypted (tampered or copied row), so
    # nothing was sent. Its row in the policy's table keeps the user and re-checks it later.
    "undecryptable",
]
OUTCOME_KINDS: tuple[OutcomeKind, ...] = get_args(OutcomeKind)
# The reads the service answered for the client, whatever it said of the user: what health
# and the last success count as reads that succeeded (the policy's `authenticated` rows;
# a test checks they agree).
ANSWERED_KINDS: frozenset[OutcomeKind] = frozenset(
    {"ok", "none", "scope_denied", "revoked", "unlinked", "inactive"}
)
# The reads that failed: 5xx, network, broken body (the user is backed off).
FAILED_KINDS: frozenset[OutcomeKind] = frozenset({"transient"})


def answered_reads(counts: Mapping[str, int], stopped: str = "completed") -> int:
    """How many of the reads counted by outcome kind the service answered, in a pass that
    `stopped` so: none in a pass stopped by the circuit breaker, which read nothing (its
    answers, 404s say, only showed the client or its URLs wrong) and wrote nothing."""
    if stopped == "breaker":
        return 0
    return sum(counts.get(kind, 0) for kind in ANSWERED_KINDS)


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP exchange as the API client saw it, before any interpretation.

    `status` is None when no response arrived (`error` says why: `timeout`, `connect`,
    `reset`, `protocol`, ...); with a status, `error` `decoding` says its body came under a
    content coding, which the client asks not to get and never decodes: it is left empty.
    `body` is at most the configured size; `truncated` says the response was larger and
    cut; `echoed` says a success body holds a credential (`classify.echoes`: the API
    client looks, since only it holds the credential). Header names are lower-case.
    """

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    truncated: bool = False
    elapsed: float = 0.0
    echoed: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """A classified answer.

    `payload` is set for `ok`, and `content`, its canonical JSON (`canonical_json`): what
    its hashes are taken of, serialised once; `code` is the service's error code when it gave one;
    `wait` is seconds to wait for `rate_limited`; `reason` explains `transient` and
    `rejected` in words fit for a log (never a secret); `at` is when the answer came (the
    shell stamps it: each stored result carries its own read's time; None: the decision's).
    """

    kind: OutcomeKind
    status: int | None = None
    payload: Any = None
    code: str | None = None
    wait: float | None = None
    reason: str | None = None
    content: bytes | None = None
    at: datetime | None = None

    def canonical(self) -> bytes:
        """`content`, or the payload's canonical JSON when the outcome was built without it."""
        return self.content if self.content is not None else canonical_json(self.payload)


def canonical_json(payload: Any) -> bytes:
    """The canonical JSON form of a payload: sorted keys, no whitespace, UTF-8."""
    text = json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")
