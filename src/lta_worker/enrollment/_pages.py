"""The pages of the browser enrollment: one small HTML page per outcome, no script, every
value escaped; `SECURITY_HEADERS` (a CSP allowing only the style's hash) go on every answer.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Mapping
from typing import Final

from lta_worker.protocol import LATEST_CHANGE_SCOPE, STATS_SCOPE

_STYLE: Final = (
    "body{font-family:system-ui,sans-serif;line-height:1.5;margin:0;color:#1a1a1a;"
    "background:#fff}main{max-width:36rem;margin:3rem auto;padding:0 1rem}"
    "h1{font-size:1.5rem}"
)
_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "content-security-policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

_NEW_LINK: Final = "Please ask for a new link."
#: title and explanation of each outcome (`BrowserFlow`'s kinds, plus `not_found`).
TEXTS: Final[Mapping[str, tuple[str, str]]] = {
    "enrolled": ("Access granted", "Thank you. Access is set up for: {scopes}."),
    "denied": (
        "Access not granted",
        "You chose not to allow access; nothing was shared. If that was a mistake, ask "
        "for a new link.",
    ),
    "link_invalid": (
        "This link does not work",
        "The link is incomplete or was changed. Copy the whole link, or ask for a new one.",
    ),
    "link_expired": ("This link has expired", _NEW_LINK),
    "link_used": ("This link was already used", "Each link works once. " + _NEW_LINK),
    "no_cookie": (
        "Your request could not be checked",
        "Open the link and finish in the same browser, with cookies allowed for this site, "
        "within 10 minutes. " + _NEW_LINK,
    ),
    "state_mismatch": (
        "This answer does not match your request",
        "Another request was started in this browser since, or the answer was not meant "
        "for it. " + _NEW_LINK,
    ),
    "consent_expired": (
        "This request has expired",
        "A request must be finished within 10 minutes, once. " + _NEW_LINK,
    ),
    "not_available": (
        "Not available yet",
        "Access cannot be granted to this application yet; nothing was shared. "
        "Please try again later.",
    ),
    "failed": (
        "Something went wrong",
        "Access could not be set up this time; nothing was changed. Please try again "
        "later with a new link.",
    ),
    "bad_request": ("Nothing to do here", "This address only receives the answer of a request."),
    "not_found": ("Page not found", "There is no page at this address."),
}
SCOPE_WORDS: Final[Mapping[str, str]] = {
    LATEST_CHANGE_SCOPE: "your latest change",
    STATS_SCOPE: "your statistics",
}


def render(kind: str, scopes: tuple[str, ...] = ()) -> str:
    """The HTML page of an outcome (`TEXTS`' keys); scopes name what was granted."""
    title, text = TEXTS[kind]
    granted = ", ".join(SCOPE_WORDS.get(s, s) for s in scopes) or "nothing"
    body = html.escape(text.format(scopes=granted))
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f'<body>\n<main>\n<h1 id="outcome" data-outcome="{html.escape(kind)}">'
        f"{html.escape(title)}</h1>\n<p>{body}</p>\n</main>\n</body>\n</html>\n"
    )
