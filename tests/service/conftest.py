"""Fixtures for the service tests: a simulator served on loopback, a workspace, and a fake
systemd notify socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lta_worker.simulator import RunningSimulator
from support.process import NotifySocket, Workspace, serve_simulator


@pytest.fixture
def running() -> Iterator[RunningSimulator]:
    with serve_simulator(budget=100_000) as served:
        yield served


@pytest.fixture
def world(tmp_path: Path, running: RunningSimulator) -> Workspace:
    return Workspace(running, tmp_path)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()
