"""A faithful stand-in for the Long Term Access service, as one ASGI (Starlette) app.

Every row of the spec's tables is implemented: consent (auto-approved for a queued user),
the token endpoint with PKCE, enrollment and rotation, drop, both reads in both auth modes,
scopes, revocation by the user, account deletion, operator withdrawal, 90-day inactivity,
NoCloudSyncLinked, 404, a per-client budget with RateLimit headers and 429, and injectable
faults. In tests it runs in-process through `SimulatorTransport`; for demos and benchmarks,
on a loopback port with `start_in_thread`.

    sim = Simulator(clock=ManualClock())
    async with httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as http:
        ...
    with start_in_thread(sim) as running:
        running.base_url, running.auth_url

Layout: `core` (the `Simulator`), `control_ops` (its operator/user methods), `oauth` (consent
and code exchange), `access` (authentication, enrollment, drop, reads), `budget` (pure window
arithmetic and headers), `faults`, `payloads`, `responses` (error styles), `state` (records),
`clock`; routes in `api_routes`, `auth_routes`, `control`; `server` and `transport` serve it.
"""

from __future__ import annotations

from lta_worker.simulator.budget import HEADER_FORMATS, HeaderFormat, Quota
from lta_worker.simulator.clock import Clock, ManualClock, SystemClock
from lta_worker.simulator.control_ops import ControlError
from lta_worker.simulator.core import PublicAnswer, Simulator
from lta_worker.simulator.faults import FAULT_KINDS, FaultKind, FaultRule, SimulatedDrop
from lta_worker.simulator.server import RunningSimulator, build_app, serve_forever, start_in_thread
from lta_worker.simulator.state import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    ERROR_STYLES,
    HISTORY_SCOPE,
    LATEST_CHANGE_SCOPE,
    LONG_TERM_SCOPES,
    PLAIN_CLIENT_ID,
    PLAIN_CLIENT_SECRET,
    STATS_SCOPE,
    Client,
    ErrorStyle,
    LogEntry,
    SimSettings,
    default_clients,
)
from lta_worker.simulator.transport import SimulatorTransport

__all__ = [
    "DEMO_CLIENT_ID",
    "DEMO_CLIENT_SECRET",
    "ERROR_STYLES",
    "FAULT_KINDS",
    "HEADER_FORMATS",
    "HISTORY_SCOPE",
    "LATEST_CHANGE_SCOPE",
    "LONG_TERM_SCOPES",
    "PLAIN_CLIENT_ID",
    "PLAIN_CLIENT_SECRET",
    "STATS_SCOPE",
    "Client",
    "Clock",
    "ControlError",
    "ErrorStyle",
    "FaultKind",
    "FaultRule",
    "HeaderFormat",
    "LogEntry",
    "ManualClock",
    "PublicAnswer",
    "Quota",
    "RunningSimulator",
    "SimSettings",
    "SimulatedDrop",
    "Simulator",
    "SimulatorTransport",
    "SystemClock",
    "build_app",
    "default_clients",
    "serve_forever",
    "start_in_thread",
]
