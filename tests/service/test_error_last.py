"""A failing exit ends with its `error` event as the last log line (docs/log-events.md): `run`
stopped by the breaker, SIGTERM or its deadline (unreachable: test_exit_codes; a failed check:
test_check); `check --format json` with a broken config still prints its JSON."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from support.process import Workspace, stop


def last_event(stderr: str) -> dict[str, Any]:
    """The last line of a child's stderr, parsed as a JSON log event."""
    lines = stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    event: dict[str, Any] = json.loads(lines[-1])
    return event


def wrong_secret(world: Workspace) -> None:
    world.enroll([f"user-{n}" for n in range(6)])
    world.secret_file.write_text("not-the-secret\n")


def test_a_run_stopped_by_the_breaker_ends_with_its_error_event(world: Workspace) -> None:
    """`run` stopped by the breaker: 78, the `error` event last (unreachable: test_exit_codes)."""
    wrong_secret(world)
    done = world.here("run")
    assert done.returncode == 78, done.stderr
    event = last_event(done.stderr)
    assert (event["event"], event["level"], event["exit_code"]) == ("error", "error", 78)
    assert event["message"] and event["error"] == "PassStoppedError"


def test_a_run_past_its_deadline_ends_with_its_error_event(world: Workspace) -> None:
    """`run --max-duration` reached with users still due: 75, the `error` event last."""
    world.enroll(["ada", "bob"])
    world.sim.inject_fault("latency", rate=1.0, delay=3.0)
    done = world.here("run", "--max-duration", "1s")
    assert done.returncode == 75, done.stderr
    event = last_event(done.stderr)
    assert (event["event"], event["exit_code"]) == ("error", 75)
    assert "deadline" in event["message"] or "max-duration" in event["message"]


def test_a_run_stopped_by_sigterm_ends_with_its_error_event(world: Workspace) -> None:
    """SIGTERM during a `run` pass: 75, and the `error` event is the last line."""
    world.enroll(["ada", "bob"])
    world.sim.inject_fault("latency", rate=1.0, delay=2.0)
    proc = world.spawn("run")
    try:
        world.wait_for_event("pass.started", proc)
        time.sleep(0.2)  # let the first read go out; the stop is the same either way
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 75
    finally:
        stop(proc)
    event = last_event(proc.stderr())
    assert (event["event"], event["exit_code"]) == ("error", 75)


def test_check_json_with_a_broken_config_prints_its_json(world: Workspace) -> None:
    """`check --format json` with a configuration that does not load: the JSON on stdout
    (the `config` check failed, naming the key) and the `error` event on stderr, exit 78."""
    world.configure(poll={"interval": "0s"})
    done = world.here("check", "--format", "json")
    assert done.returncode == 78
    data = json.loads(done.stdout)
    assert (data["ok"], data["exit_code"]) == (False, 78)
    config = data["checks"][0]
    assert (config["name"], config["ok"], config["exit_code"]) == ("config", False, 78)
    assert "poll.interval" in config["message"]
    assert last_event(done.stderr)["event"] == "error"
