"""Enrollment and the end of access, as the Python API a web application embeds
(docs/python-api.md), and the browser flow (signed links, its ASGI app)."""

from __future__ import annotations

from lta_worker.enrollment._browser import BrowserFlow, Outcome
from lta_worker.enrollment._enroll import (
    FAILURE_STAGES,
    STATE_FAILURES,
    Enrollment,
    EnrollResult,
    challenge_s256,
    new_state,
    new_verifier,
    parse_redirect,
)
from lta_worker.enrollment._lifecycle import DropResult, DropRetries, Lifecycle
from lta_worker.enrollment._links import EnrollLinks
from lta_worker.enrollment._web import build_enroll_app

__all__ = [
    "FAILURE_STAGES",
    "STATE_FAILURES",
    "BrowserFlow",
    "DropResult",
    "DropRetries",
    "EnrollLinks",
    "EnrollResult",
    "Enrollment",
    "Lifecycle",
    "Outcome",
    "build_enroll_app",
    "challenge_s256",
    "new_state",
    "new_verifier",
    "parse_redirect",
]
