"""Fixtures for the service tests: a simulator served on loopback, a workspace, a fake systemd
notify socket; and the `[enroll] listen` setup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lta_worker.simulator import DEMO_CLIENT_ID, RunningSimulator
from support.process import (
    REDIRECT,
    NotifySocket,
    Workspace,
    free_port,
    serve_simulator,
    write_private,
)


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


def listen_for_enrollment(world: Workspace, port: int | None = None) -> str:
    """`[enroll] listen` on `port` (a free one by default), a link key file, the callback
    registered for the demo client; the public URL."""
    public = f"http://127.0.0.1:{port or free_port()}"
    keys = write_private(world.tmp / "enroll-link-key", "k" * 44 + "\n")
    world.sim.add_redirect_uri(DEMO_CLIENT_ID, f"{public}/lta/callback")
    world.write_config(
        world.config_text().replace(REDIRECT, f"{public}/lta/callback")
        + f'\n[enroll]\nlisten = "{public.removeprefix("http://")}"\npublic_url = "{public}"\n'
        f'link_key_file = "{keys}"\n'
    )
    return public
