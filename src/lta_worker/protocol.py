"""The service's facts from the spec, once: paths, the token prefix, error codes, scopes and
header names. The simulator keeps its own copy; `tests/simulator/test_sim_protocol.py` checks
that the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

# -- the two reads (spec 5), under `service.base_url` ------------------------------------

Endpoint = Literal["latest-change", "stats"]
ENDPOINTS: Final[tuple[Endpoint, ...]] = get_args(Endpoint)
READ_PATHS: Final[Mapping[Endpoint, str]] = {
    "latest-change": "/api/v1/history/latest-change",
    "stats": "/api/v1/history/stats",
}

# -- under `service.auth_url` (spec 4) ------------------------------------------------------

AUTHORIZE_PATH: Final = "/oidc/auth"
TOKEN_ENDPOINT_PATH: Final = "/oidc/token"  # noqa: S105 - a path, not a secret
# Create (POST, with a user access token) and drop (DELETE, with the long term credential).
TOKENS_PATH: Final = "/api/long-term-access/tokens"

# A credential starting with this is a long term one (spec 5.1); the service's tokens do.
TOKEN_PREFIX: Final = "dspa_"  # noqa: S105 - the public prefix, not a token

# -- scopes (spec 3) ---------------------------------------------------------------------

OPENID_SCOPE: Final = "openid"
LONG_TERM_FAMILY: Final = "cloud-sync.permanent."
LATEST_CHANGE_SCOPE: Final = "cloud-sync.permanent.latest-change"
STATS_SCOPE: Final = "cloud-sync.permanent.stats"
LONG_TERM_SCOPES: Final = (LATEST_CHANGE_SCOPE, STATS_SCOPE)
ENDPOINT_SCOPES: Final[Mapping[Endpoint, str]] = {
    "latest-change": LATEST_CHANGE_SCOPE,
    "stats": STATS_SCOPE,
}

# -- the error codes of the reads (spec 7) ------------------------------------------------

REVOKED: Final = "PermanentAccessRevoked"  # 401: the access is gone for good
NOT_LINKED: Final = "NoCloudSyncLinked"  # 401: the user has no cloud sync linked
INACTIVE: Final = "CloudSyncInactive"  # 403: cloud sync silent too long; comes back
ERROR_CODES: Final = (REVOKED, NOT_LINKED, INACTIVE)


# The regular mode's client header (spec 5); long term reads must not need it.
CLIENT_ID_HEADER: Final = "DS-API-CLIENT-ID"
# The budget's fields (spec 8: "the standard RateLimit response headers"): IETF drafts
# (`RateLimit` + `RateLimit-Policy`), the older triple, and its `X-` form.
RATELIMIT: Final = "RateLimit"
RATELIMIT_POLICY: Final = "RateLimit-Policy"
RATELIMIT_TRIPLE_PREFIX: Final = "RateLimit-"  # + Limit, Remaining, Reset
X_RATELIMIT_PREFIX: Final = "X-RateLimit-"  # + Limit, Remaining, Reset
RETRY_AFTER: Final = "Retry-After"
