"""Serving on a loopback port with uvicorn, and the `lta-worker simulator` command."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from lta_worker.cli import cli
from lta_worker.simulator import ManualClock, Simulator, start_in_thread

from .helpers import STATS, bearer


def test_start_in_thread_serves_on_loopback_and_refuses_an_unknown_credential() -> None:
    """A real request with an unknown credential gets a plain 401 on loopback; stop() stops."""
    with start_in_thread(Simulator(clock=ManualClock())) as running:
        assert running.base_url.startswith("http://127.0.0.1:")
        assert running.port > 0
        assert running.auth_url == running.base_url + "/auth"
        with httpx.Client(base_url=running.base_url, timeout=5) as http:
            response = http.get(STATS, headers=bearer("dspa_x.y"))
    assert response.status_code == 401
    assert response.json() == {"message": "Unauthorized"}
    assert response.headers["www-authenticate"] == 'Bearer realm="api"'
    assert response.headers["ratelimit-policy"] == '"default";q=120;w=3600'
    with pytest.raises(httpx.ConnectError), httpx.Client(timeout=2) as http:
        http.get(running.base_url + STATS)  # leaving the block stopped it


def test_a_dropped_connection_over_a_real_socket_is_a_remote_protocol_error() -> None:
    """Under uvicorn a drop fault closes the socket mid-answer, as the in-process transport says."""
    sim = Simulator(clock=ManualClock())
    sim.inject_fault("drop", count=1)
    with (
        start_in_thread(sim) as running,
        httpx.Client(base_url=running.base_url, timeout=5) as http,
    ):
        with pytest.raises(httpx.RemoteProtocolError):
            http.get(STATS)
        assert http.get(STATS).status_code == 401


def test_cli_refuses_a_non_loopback_host_from_the_environment() -> None:
    """A non-loopback host that was not given as --host is refused before anything listens."""
    result = CliRunner().invoke(
        cli, ["simulator", "serve"], env={"LTA_SIMULATOR_HOST": "0.0.0.0"}, standalone_mode=True
    )
    assert result.exit_code == 2
    assert "non-loopback" in result.output
