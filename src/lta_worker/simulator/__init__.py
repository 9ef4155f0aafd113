"""A faithful stand-in for the Long Term Access service (every row of the spec's tables), as
one Starlette app: in-process through `SimulatorTransport`, or on a loopback port with
`start_in_thread`. See docs/simulator.md.
"""

from __future__ import annotations

from lta_worker.simulator.budget import HEADER_FORMATS, Quota
from lta_worker.simulator.control_ops import ControlError
from lta_worker.simulator.core import Simulator
from lta_worker.simulator.server import (
    RunningSimulator,
    SimulatorTransport,
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
    "LogEntry",
    "ManualClock",
    "Quota",
    "RunningSimulator",
    "SimSettings",
    "Simulator",
    "SimulatorTransport",
    "SystemClock",
    "default_clients",
    "start_in_thread",
]
