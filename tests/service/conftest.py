"""Fixtures for the service tests: a simulator served on loopback, a config directory, and a
fake systemd notify socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lta_worker.simulator import RunningSimulator, Simulator, start_in_thread

from .helpers import NotifySocket, World


@pytest.fixture
def running() -> Iterator[RunningSimulator]:
    with start_in_thread(Simulator()) as served:
        served.sim.configure(budget=100_000, window=3600)
        yield served


@pytest.fixture
def world(tmp_path: Path, running: RunningSimulator) -> World:
    return World(running, tmp_path)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()
