"""Enrollment and the end of access, as the Python API a web application embeds.

- `Enrollment`: consent with PKCE and a state bound to the user, code exchange, long term
  token creation and rotation, encrypted storage (`_enroll`); `EnrollResult`,
  `parse_redirect`, `check_user_id`;
- `Lifecycle`: the two-phase drop (`dropping`, then `dropped` once the service confirms),
  forget, and the retries of pending drops (`_lifecycle`); `DropResult`, `DropRetries`;
- PKCE S256 and the OAuth state (`_pkce`);
- enrollment in the browser: signed links (`EnrollLinks`, `_links`), the flow without HTTP
  (`BrowserFlow`, `_browser`) and its ASGI app (`build_enroll_app`, `_web`: needs the
  `[web]` extra, imported only when used).
"""

from __future__ import annotations

from lta_worker.enrollment._base import ClientOperation
from lta_worker.enrollment._browser import BrowserFlow, Outcome
from lta_worker.enrollment._enroll import (
    FAILURE_STAGES,
    STATE_FAILURES,
    Enrollment,
    EnrollResult,
    check_user_id,
    parse_redirect,
)
from lta_worker.enrollment._lifecycle import DropResult, DropRetries, Lifecycle
from lta_worker.enrollment._links import EnrollLinks
from lta_worker.enrollment._pkce import challenge_s256, new_state, new_verifier
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
