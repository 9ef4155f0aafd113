"""Options and fixtures of the reliability suite.

`pytest tests/reliability --iterations 200` runs 200 kills instead of CI's 10 and scales the
SIGTERM stops and per-test timeouts by the same factor (20: 100 SIGTERMs each for `run` and
`serve`); from the project root use `LTA_RELIABILITY_ITERATIONS=200 pytest`.
`LTA_RELIABILITY_SEED` changes every random choice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lta_worker.simulator import RunningSimulator
from support.process import serve_simulator

from .crash import ITERATIONS_ENV

# Per-test timeout (seconds) at scale 1; scaled with the iteration count.
BASE_TIMEOUT = 120


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--iterations N`: N kills, and the SIGTERM loops scaled by N/10."""
    parser.addoption(
        "--iterations",
        type=int,
        default=None,
        help="reliability suite: N kill -9 moments (CI: 10); SIGTERM stops scale by N/10 "
        f"(also ${ITERATIONS_ENV})",
    )


def scale(config: pytest.Config) -> float:
    """How much more than CI to do: `--iterations N` (or the environment) over CI's 10
    kills; never less than CI."""
    raw = config.getoption("iterations", default=None) or os.environ.get(ITERATIONS_ENV)
    if not raw:
        return 1.0
    return max(1.0, int(raw) / 10)


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
