"""Fixtures of the simulator's tests: a manual clock, the simulator, an in-process client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from lta_worker.simulator import ManualClock, Simulator, SimulatorTransport

from .helpers import BASE, Flow


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when a test moves it."""
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> Simulator:
    """A fresh simulator on the manual clock, with the default clients and settings."""
    return Simulator(clock=clock, seed=1234)


@pytest.fixture
async def http(sim: Simulator) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to `sim` in-process."""
    async with httpx.AsyncClient(transport=SimulatorTransport(sim), base_url=BASE) as client:
        yield client


@pytest.fixture
def flow(sim: Simulator, http: httpx.AsyncClient) -> Flow:
    """The client-side flow against `sim`."""
    return Flow(sim, http)
