"""The simulator's copy of the service's facts (it imports nothing of the worker) agrees with
the worker's `lta_worker.protocol`."""

from __future__ import annotations

import pytest

from lta_worker import protocol
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    HEADER_FORMATS,
    HISTORY_SCOPE,
    Quota,
    responses,
    server,
    state,
)
from lta_worker.simulator.budget import render

from .helpers import Flow, bearer


@pytest.mark.anyio
async def test_the_simulator_and_the_worker_agree_on_the_protocol(flow: Flow) -> None:
    """Paths, token prefix, scopes, error codes and header names are the same on both sides."""
    sim = flow.sim
    assert {e: p for p, e in server.READ_PATHS.items()} == dict(protocol.READ_PATHS)
    auth_paths = {route.path for route in server.auth_routes(sim)}
    assert {protocol.AUTHORIZE_PATH, protocol.TOKEN_ENDPOINT_PATH, protocol.TOKENS_PATH} <= (
        auth_paths
    )
    assert state.TOKEN_PREFIX == protocol.TOKEN_PREFIX
    assert state.ENDPOINTS == protocol.ENDPOINTS
    assert state.LONG_TERM_FAMILY == protocol.LONG_TERM_FAMILY
    assert state.LONG_TERM_SCOPES == protocol.LONG_TERM_SCOPES
    assert dict(state.ENDPOINT_SCOPES) == dict(protocol.ENDPOINT_SCOPES)
    assert (responses.REVOKED, responses.UNLINKED, responses.INACTIVE) == protocol.ERROR_CODES
    # Every rate limit field the simulator can send is one the worker names.
    quota = Quota(limit=10, remaining=3, reset=30, reset_at=1_735_689_630, window=60)
    rendered = {name for fmt in HEADER_FORMATS for name, _ in render(fmt, quota)}
    triples = (protocol.RATELIMIT_TRIPLE_PREFIX, protocol.X_RATELIMIT_PREFIX)
    named = {p + field for p in triples for field in ("Limit", "Remaining", "Reset")}
    assert rendered == {protocol.RATELIMIT, protocol.RATELIMIT_POLICY} | named
    # The regular mode's client header is the one the simulator reads; its 429 says when.
    user_token = await flow.user_token("alice", [HISTORY_SCOPE])
    regular = bearer(user_token) | {protocol.CLIENT_ID_HEADER: DEMO_CLIENT_ID}
    sim.configure(budget=1, window=60)
    path = protocol.READ_PATHS["stats"]
    assert (await flow.http.get(path, headers=regular)).status_code == 200
    refused = await flow.http.get(path, headers=regular)
    assert refused.status_code == 429
    assert protocol.RETRY_AFTER in refused.headers
