"""Lifecycle commands in separate processes against the simulator on a loopback port (issue 11).

A `run` process is held inside a read (the simulator's latency fault, whose sleep waits for
the test) while `users forget` runs in another process: the forget wins.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from lta_worker.cli._users_cmd import _report
from lta_worker.enrollment import DropResult
from lta_worker.errors import LtaError
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET, Simulator
from lta_worker.simulator.server import RunningSimulator, start_in_thread

from .test_enroll_cmd import make_cli


class ReadGate:
    """The simulator's sleep for latency faults: says when a read is held, waits for release."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    async def sleep(self, seconds: float) -> None:
        self.reached.set()
        await anyio.to_thread.run_sync(self.release.wait, 60.0)


@pytest.fixture
def gate() -> ReadGate:
    return ReadGate()


@pytest.fixture
def gated(gate: ReadGate) -> Iterator[RunningSimulator]:
    with start_in_thread(Simulator(sleep=gate.sleep)) as served:
        yield served


def test_forget_in_another_process_wins_over_a_running_pass(
    tmp_path: Path, gated: RunningSimulator, gate: ReadGate
) -> None:
    """`users forget` while `run` holds the user: after the pass it is dropped, nothing stored."""
    cli = make_cli(tmp_path, gated, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)
    cli.enroll_by_cli("x", "svc-x")
    gated.sim.inject_fault("latency", count=1, delay=1.0)
    run = cli.spawn("run")
    try:
        assert gate.reached.wait(60), "the pass never read"
        forgot = cli.cli("users", "forget", "--user", "x")
        assert forgot.returncode == 0, forgot.stderr
    finally:
        gate.release.set()
        assert run.wait(60) == 0, run.stderr()[-2000:]
    err = run.stderr()
    assert '"poll.discarded"' in err
    listed = {u["user"]: u for u in json.loads(cli.cli("users", "list", "--format", "json").stdout)}
    assert (listed["x"]["state"], listed["x"]["has_token"]) == ("dropped", False)
    exported = cli.cli("results", "export", "--user", "x")
    assert (exported.returncode, exported.stdout.strip()) == (0, "")


def test_drop_with_the_service_unreachable_is_pending_then_sent_again(tmp_path: Path) -> None:
    """Unreachable: `users drop` says so in one line and exits 75; a later drop confirms."""
    with start_in_thread(Simulator()) as served:
        cli = make_cli(tmp_path, served, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)
        cli.enroll_by_cli("x", "svc-x")
        good = cli.config.read_text(encoding="utf-8")
        cli.config.write_text(
            good.replace(f'auth_url = "{served.auth_url}"', 'auth_url = "http://127.0.0.1:9"'),
            encoding="utf-8",
        )
        pending = cli.here("users", "drop", "--user", "x")
        assert pending.returncode == 75, pending.stderr
        # JSON logs: every line is JSON, the last the `error` event saying the drop is retried.
        events = [json.loads(line) for line in pending.stderr.splitlines()]
        assert events[-1]["event"] == "error" and "retry" in events[-1]["message"]
        listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
        assert (listed[0]["state"], listed[0]["has_token"]) == ("dropping", True)
        cli.config.write_text(good, encoding="utf-8")
        again = cli.here("users", "drop", "--user", "x")
        assert again.returncode == 0, again.stderr
        listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
        assert (listed[0]["state"], listed[0]["has_token"]) == ("dropped", False)
        # No pass read the dropping user: the only reads are the two drops' own, one before
        # each DELETE (a plain 401 there would have kept the token).
        reads = [r for r in served.sim.requests() if "/api/v1/history/" in r.path]
        assert [(r.method, r.status) for r in reads] == [("GET", 200), ("GET", 200)]


@pytest.mark.parametrize(
    ("upstream", "state", "code", "says"),
    [
        ("ok", "dropped", 0, "the service dropped the token (HTTP 204)"),
        ("skipped", "revoked", 0, "'x' is revoked: no token is held"),
        ("failed", "dropping", 75, "retry the drop"),
        ("refused", "dropping", 78, "retry the drop"),
        ("in_flight", "dropping", 75, "a DELETE of its token is already out"),
        ("ok+overtaken", "active", 75, "overtaken by a new consent"),
        ("failed+overtaken", "active", 75, "overtaken by a new consent"),
        ("ok+overtaken", "dropped", 0, "another drop of it was confirmed"),
        ("ok+overtaken", "dropping", 75, "retry the drop"),
    ],
)
def test_drop_report_exit_codes(
    capsys: pytest.CaptureFixture[str], upstream: str, state: str, code: int, says: str
) -> None:
    """A drop's report: confirmed 0 in one line; otherwise 75, or 78 when refused."""
    upstream, _, overtaken = upstream.partition("+")
    result = DropResult(
        user="x",
        upstream=upstream,  # type: ignore[arg-type]
        status=204 if upstream == "ok" else None,
        error="could not reach the service (connect)",
        previous_state="active",
        state=state,
        overtaken=bool(overtaken),
    )
    if code == 0:
        assert _report(result, "dropped") == code
        out, err = capsys.readouterr()
        lines = (out + err).splitlines()
        assert len(lines) == 1 and says in lines[0]
        return
    with pytest.raises(LtaError) as raised:  # the CLI's boundary prints its one line
        _report(result, "dropped")
    assert raised.value.exit_code == code and says in raised.value.message
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("verb", ["drop", "forget"])
def test_unusable_secret_file_changes_nothing(tmp_path: Path, verb: str) -> None:
    """An unusable secret file (a directory) stops drop/forget with 78 before any change or
    DELETE (each way a secret file is refused: tests/reliability/test_bad_input.py)."""
    with start_in_thread(Simulator()) as served:
        cli = make_cli(tmp_path, served, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)
        cli.enroll_by_cli("x", "svc-x")
        (tmp_path / "client-secret").unlink()
        (tmp_path / "client-secret").mkdir(mode=0o700)
        done = cli.here("users", verb, "--user", "x")
        assert done.returncode == 78, done.stderr
        assert "client.secret_file" in done.stderr
        listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
        assert (listed[0]["state"], listed[0]["has_token"]) == ("active", True)
        assert [r for r in served.sim.requests() if r.method == "DELETE"] == []
