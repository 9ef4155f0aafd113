"""A command imports only what it uses: `status`, and a `run` with nobody due (cron), leave out
the libraries they do not need (bench B4's start-up budget; the figures are B4's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from lta_worker.simulator import RunningSimulator
from support.process import Workspace

# Never needed by these two commands on SQLite: the ORM (the queries are Core), the
# PostgreSQL dialect, migrations, the HTTP stack (nobody is due), encryption (nothing is
# decrypted), the scheduler of `serve`, the web stack, metrics (not configured), pydantic.
NEVER = (
    "sqlalchemy.orm",
    "sqlalchemy.dialects.postgresql",
    "alembic",
    "httpx",
    "httpcore",
    "cryptography",
    "apscheduler",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "pydantic",
    "lta_worker.simulator",
    "lta_worker.cli._demo",
)
NOT_IN_STATUS = (*NEVER, "anyio", "structlog", "lta_worker.worker._engine")

CHILD = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from lta_worker.cli import main
main()
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A valid config over a migrated SQLite database holding users none of whom is due, its
    service at a port nobody answers on."""
    nowhere = SimpleNamespace(base_url="http://127.0.0.1:9", auth_url="http://127.0.0.1:9")
    world = Workspace(cast(RunningSimulator, nowhere), tmp_path_factory.mktemp("start"))
    world.plant_tokens(2)
    return world


def imported(tmp_path: Path, config: Path, *args: str) -> set[str]:
    """The modules loaded by `lta-worker --config CONFIG ARGS` in a fresh interpreter."""
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    modules = set(json.loads(out.read_text()))
    assert {"sqlalchemy", "lta_worker.storage._store"} <= modules  # the dump saw the work
    return modules


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The names (packages with their submodules) found among `modules`."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_status_imports_only_what_it_reads_with(tmp_path: Path, world: Workspace) -> None:
    """`status` imports no ORM, migrations, HTTP, encryption, async, logging or settings library."""
    assert loaded(imported(tmp_path, world.config, "status"), NOT_IN_STATUS) == []


def test_run_with_nobody_due_builds_no_http_client(tmp_path: Path, world: Workspace) -> None:
    """A `run` with nobody due records its pass without importing HTTP, ORM or encryption."""
    modules = imported(tmp_path, world.config, "run")
    assert loaded(modules, NEVER) == []
    assert "lta_worker.worker._engine" in modules
    with world.store() as store:
        last = store.last_pass()
    assert last is not None and last.stopped == "completed"
