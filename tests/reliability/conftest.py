"""Options and fixtures of the reliability suite.

More iterations on demand: `pytest tests/reliability --iterations 200` (the option is
registered here, so it is known when this directory is named on the command line), or
`LTA_RELIABILITY_ITERATIONS=200 pytest` from anywhere. The iteration count multiplies the
CI defaults (20 kills, 10 SIGTERMs, the fuzzers' examples) and the per-test timeouts.
`LTA_RELIABILITY_SEED` changes the seed of every random choice (kill moments, faults).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lta_worker.simulator import RunningSimulator

from .harness import ITERATIONS_ENV, serve_simulator

# Per-test timeout (seconds) at scale 1; scaled with the iteration count.
BASE_TIMEOUT = 120


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--iterations N`: scale the kill, SIGTERM and fuzz loops (default: CI's counts)."""
    parser.addoption(
        "--iterations",
        type=int,
        default=None,
        help="reliability suite: multiply the CI iteration counts by N/20 for kills, "
        f"N/10 for SIGTERMs (also ${ITERATIONS_ENV})",
    )


def scale(config: pytest.Config) -> float:
    """How much more than CI to do: `--iterations N` or the environment, over 20 kills."""
    raw = config.getoption("iterations", default=None) or os.environ.get(ITERATIONS_ENV)
    if not raw:
        return 1.0
    return max(1.0, int(raw) / 20)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scale each reliability test's timeout with the iteration count."""
    factor = scale(config)
    if factor == 1.0:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(int(BASE_TIMEOUT * factor)))


@pytest.fixture
def iterations(request: pytest.FixtureRequest) -> float:
    """The scale factor (1.0 in CI)."""
    return scale(request.config)


@pytest.fixture(scope="module")
def running() -> Iterator[RunningSimulator]:
    """A simulator served on a loopback port for the whole module."""
    with serve_simulator() as served:
        yield served
