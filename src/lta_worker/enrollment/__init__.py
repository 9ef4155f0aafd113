"""Enrollment and the end of access, as the Python API a web application embeds.

`Enrollment` (`_enroll`: PKCE consent, exchange, token creation), `Lifecycle` (`_lifecycle`:
drop, forget, retries), and the browser flow: signed links (`_links`), `BrowserFlow`
(`_browser`) and its ASGI app (`_web`, the `[web]` extra). docs/python-api.md.
"""

from __future__ import annotations

from lta_worker.enrollment._base import ClientOperation
from lta_worker.enrollment._browser import BrowserFlow, Outcome
from lta_worker.enrollment._enroll import (
    FAILURE_STAGES,
    STATE_FAILURES,
    Enrollment,
    EnrollResult,
    challenge_s256,
    check_user_id,
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
    "ClientOperation",
    "DropResult",
    "DropRetries",
    "EnrollLinks",
    "EnrollResult",
    "Enrollment",
    "Lifecycle",
    "Outcome",
    "build_enroll_app",
    "challenge_s256",
    "check_user_id",
    "new_state",
    "new_verifier",
    "parse_redirect",
]
