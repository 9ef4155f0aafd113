"""A faithful stand-in for the Long Term Access service (every row of the spec's tables), as
one Starlette app: in-process through `SimulatorTransport` in tests, on a loopback port with
`start_in_thread` for demos and benchmarks. See docs/simulator.md.

Layout: `core` (the `Simulator`), `control_ops` (operator/user methods), `oauth`, `access`,
`budget`, `faults`, `payloads`, `responses`, `state` (records, clock); `routes`, `control`
and `server` serve it.
"""

from __future__ import annotations

from lta_worker.simulator.budget import HEADER_FORMATS, HeaderFormat, Quota
from lta_worker.simulator.control_ops import ControlError
from lta_worker.simulator.core import PublicAnswer, Simulator
from lta_worker.simulator.responses import FAULT_KINDS, FaultKind, FaultRule, SimulatedDrop
from lta_worker.simulator.server import (
    RunningSimulator,
    SimulatorTransport,
    build_app,
    serve_forever,
    start_in_thread,
)
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
    Clock,
    ErrorStyle,
    LogEntry,
    ManualClock,
    SimSettings,
    SystemClock,
    default_clients,
)

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
