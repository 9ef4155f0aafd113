"""Journald priorities and the per-read log level, stderr a file `$JOURNAL_STREAM` names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.process import Workspace, child_env


def run_journaled(world: Workspace, *args: str) -> tuple[int, list[str]]:
    """`lta-worker --config CFG ARGS` with stderr a file that `$JOURNAL_STREAM` names."""
    path = world.tmp / "journal.log"
    with path.open("wb") as err:
        info = os.fstat(err.fileno())
        done = subprocess.run(
            [sys.executable, "-m", "lta_worker", "--config", str(world.config), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=child_env(JOURNAL_STREAM=f"{info.st_dev}:{info.st_ino}"),
            timeout=60,
            check=False,
        )
    return done.returncode, Path(path).read_text().splitlines()


def test_journal_lines_carry_priorities_and_a_fatal_error_is_one_priority_3_line(
    world: Workspace,
) -> None:
    """Under the journal each line of `run` is its priority then the JSON event (`<6>` for
    `poll.read` and `pass.finished`); a bad setting is one `<3>` `error` line, exit 78."""
    world.enroll(["ada"])
    code, lines = run_journaled(world, "run")
    assert code == 0, lines
    events = {json.loads(line[3:])["event"]: line[:3] for line in lines}
    assert (events["poll.read"], events["pass.finished"]) == ("<6>", "<6>")
    assert all(line[:3] in {"<3>", "<4>", "<6>", "<7>"} for line in lines)
    world.configure(poll={"interval": "0s"})
    code, lines = run_journaled(world, "run")
    assert code == 78
    (line,) = lines
    assert line.startswith("<3>{")
    event = json.loads(line[3:])
    assert (event["event"], event["exit_code"], event["key"]) == ("error", 78, "poll.interval")


def test_read_level_debug_keeps_pass_finished(world: Workspace) -> None:
    """`[log] read_level = "debug"` at level info: no `poll.read` line, `pass.finished` kept."""
    world.configure(log={"read_level": "debug"})
    world.enroll(["ada"])
    done = world.here("run")
    assert done.returncode == 0, done.stderr
    assert "poll.read" not in done.event_names()
    assert "pass.finished" in done.event_names()
