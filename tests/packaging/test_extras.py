"""starlette and uvicorn are the simulator's alone: `serve` never imports them (`run`: the bare
install of test_install.py), and the commands that need them stop with a one-line hint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lta_worker.errors import EX_CONFIG
from support.process import Workspace as World
from support.process import child_env, serve_simulator

from .test_start_imports import CHILD, loaded

SIMULATOR_ONLY = ("starlette", "uvicorn", "lta_worker.simulator")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with serve_simulator() as served:
        yield World(served, tmp_path)


def test_serve_imports_no_simulator_module(world: World, tmp_path: Path) -> None:
    """`serve`, through a pass and a SIGTERM drain, loads no starlette or uvicorn."""
    world.enroll(["ada"])
    dump = tmp_path / "modules.json"
    with world.log_file.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(dump), "--config", str(world.config), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=child_env(),
        )
    try:
        world.wait_for_event("pass.finished", proc, timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, world.log_lines()[-5:]
    assert loaded(set(json.loads(dump.read_text(encoding="utf-8"))), SIMULATOR_ONLY) == []


def _without(missing: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`lta-worker ARGS` in a process where importing `missing` fails."""
    blocked = f"import sys; sys.modules[{missing!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", blocked + "from lta_worker.cli import main\nmain()\n", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("missing", ["starlette", "uvicorn"])
@pytest.mark.parametrize("command", [["simulator", "serve", "--port", "0"], ["demo"]])
def test_simulator_commands_without_the_extra(missing: str, command: list[str]) -> None:
    """Without starlette or uvicorn, `simulator serve` and `demo` exit 78 naming the extra."""
    done = _without(missing, *command)
    assert done.returncode == EX_CONFIG, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "lta-worker[simulator]" in lines[0]
    assert missing in lines[0]


@pytest.mark.parametrize("missing", ["starlette", "uvicorn"])
def test_serve_with_enroll_listen_without_the_web_extra(
    world: World, tmp_path: Path, missing: str
) -> None:
    """`serve` with `enroll.listen` but no web stack exits 78 naming the `[web]` extra, at once."""
    world.write_config(
        world.config_text().replace(
            'redirect_uri = "http://127.0.0.1/lta/callback"',
            'redirect_uri = "http://127.0.0.1:18080/lta/callback"',
        )
        + '\n[enroll]\nlisten = "127.0.0.1:18080"\npublic_url = "http://127.0.0.1:18080"\n'
    )
    done = _without(missing, "--config", str(world.config), "serve")
    assert done.returncode == EX_CONFIG, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "lta-worker[web]" in lines[0]
    assert "enroll.listen" in lines[0]
    assert missing in lines[0]
