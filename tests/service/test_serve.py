"""`lta-worker serve` as systemd runs it: a child process against the simulator on loopback,
with a fake $NOTIFY_SOCKET, stopped and reloaded by signals."""

from __future__ import annotations

import json
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lta_worker.simulator import DEMO_CLIENT_SECRET
from lta_worker.storage import generate_key_line
from support.process import NotifySocket, Spawned, Workspace, stop


def test_serve_notifies_ready_status_and_watchdog(world: Workspace, notify: NotifySocket) -> None:
    """READY=1 with MAINPID, a STATUS line after the first pass, WATCHDOG=1 pings while
    WATCHDOG_USEC is set, STOPPING=1 on SIGTERM, exit 0, and every stderr line is JSON (a pass
    far longer than the tick: the scheduler's skipped ticks write nothing of their own).
    (SIGTERM mid-pass: tests/reliability/test_sigterm.py, tests/engine/test_stop.py.)"""
    world.configure(poll={"tick": "0.3s", "concurrency": "1"}, serve={"heartbeat": "0.5s"})
    world.sim.inject_fault("latency", rate=1.0, delay=0.4)
    world.enroll(["alice", "bob", "carol"])
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="400000")
    try:
        ready = notify.wait_for(lambda m: m.get("READY") == "1")
        assert ready["MAINPID"] == str(proc.pid)
        status = notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        assert "3 users, 6 reads, 0 throttled, completed" in status["STATUS"]
        start = len(notify.messages)
        began = time.monotonic()
        notify.wait_for(lambda _: notify.count("WATCHDOG") >= start + 4, since=start)
        pings = [m for m in notify.messages[start:] if m.get("WATCHDOG") == "1"]
        assert len(pings) >= 4
        assert time.monotonic() - began < 5.0  # pings keep coming while the service runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    notify.drain()
    assert any(m.get("STOPPING") == "1" for m in notify.messages)
    events = world.log_events()
    names = [e["event"] for e in events]
    for name in ("service.started", "service.heartbeat", "pass.finished", "service.stopping"):
        assert name in names
    stopping = next(e for e in events if e["event"] == "service.stopping")
    assert (stopping["signal"], stopping["grace_s"]) == ("SIGTERM", 10.0)
    assert (events[-1]["event"], events[-1]["exit_code"]) == ("service.stopped", 0)
    finished = next(e for e in events if e["event"] == "pass.finished")
    assert (finished["stopped"], finished["users"], finished["ok"]) == ("completed", 3, 6)
    assert DEMO_CLIENT_SECRET not in world.log_file.read_text()


def test_sighup_reloads_and_a_broken_config_or_key_file_keeps_the_old_one(
    world: Workspace, notify: NotifySocket
) -> None:
    """SIGHUP applies a new config; a broken one, or a key file without a key in use, is
    refused (ok=false) and the old one kept, its keys reading on."""
    world.enroll(["alice"])
    world.configure(poll={"tick": "1h", "interval": "1s"})
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        world.configure(poll={"tick": "0.5s"})
        mark = len(notify.messages)
        proc.send_signal(signal.SIGHUP)
        reloading = notify.wait_for(lambda m: m.get("RELOADING") == "1", since=mark)
        assert int(reloading["MONOTONIC_USEC"]) > 0
        done = notify.wait_for(lambda m: m.get("READY") == "1", since=mark)
        assert done["STATUS"] == "reloaded"
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 2:"), since=mark)

        for broken in ("config", "key file"):
            if broken == "config":
                world.write_config(world.config_text() + '\n[bogus]\nkey = "x"\n')
            else:
                world.write_config()
                world.key_file.write_text(generate_key_line(datetime.now(UTC)) + "\n")
            mark = len(notify.messages)
            proc.send_signal(signal.SIGHUP)
            done = notify.wait_for(lambda m: m.get("READY") == "1", since=mark)
            assert "previous configuration" in done["STATUS"]
            _wait_until_read(world, proc, {"alice"}, since=len(_complete_lines(world)))

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    events = world.log_events()
    reloaded = [e for e in events if e["event"] == "service.reloaded"]
    assert [(e["ok"], e["level"]) for e in reloaded] == [
        (True, "info"),
        (False, "error"),
        (False, "error"),
    ]
    assert "bogus" in reloaded[1]["error"]
    assert reloaded[2]["error"].startswith("crypto.key_file: a stored token is encrypted")
    assert not any(e["event"] in {"error", "token.undecryptable"} for e in events)


def _sighup_held(pid: int) -> bool:
    """Whether the process holds SIGHUP alone (Linux: /proc/PID/status, SigBlk); not the
    moment glibc blocks every signal while it creates a thread."""
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    mask = int(next(line.split()[1] for line in status.splitlines() if "SigBlk:" in line), 16)
    return bool(mask & 1 << (signal.SIGHUP - 1)) and not mask & 1 << (signal.SIGTERM - 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_sighup_all_through_start_up_neither_ends_serve_nor_is_lost(
    world: Workspace, notify: NotifySocket
) -> None:
    """SIGHUP every few milliseconds from serve's first line of Python until it is READY:
    it starts, serves, and the config rewritten meanwhile is in force (tick 1h -> 0.5 s)."""
    world.enroll(["alice"])
    world.configure(poll={"tick": "1h"})
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    started = threading.Event()

    def hang_up_until_started() -> None:
        while not started.is_set() and proc.poll() is None:
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.005)

    try:
        deadline = time.monotonic() + 20
        while not _sighup_held(proc.pid):  # its first act, once the interpreter runs
            assert proc.poll() is None, f"serve ended with {proc.returncode} before its CLI ran"
            assert time.monotonic() < deadline, "serve never held SIGHUP"
        world.configure(poll={"tick": "0.5s"})
        spammer = threading.Thread(target=hang_up_until_started)
        spammer.start()
        try:
            notify.wait_for(lambda m: m.get("STATUS", "").startswith("started"))
        finally:
            started.set()
            spammer.join()
        assert proc.poll() is None, f"serve ended with {proc.returncode} on a SIGHUP"
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 2:"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    events = world.log_events()
    assert any(e["event"] == "service.reloaded" and e["ok"] for e in events)
    assert not any(e["event"] == "service.reloaded" and not e["ok"] for e in events)


def test_serve_exits_78_on_a_token_under_a_key_the_file_no_longer_lists(
    world: Workspace, notify: NotifySocket
) -> None:
    """A token under a removed key line stops serve with 78; no token is touched."""
    world.enroll(["alice", "bob", "carol"])
    with world.store() as store:
        before = {u.user: u.token for u in store.list_users()}
    world.key_file.write_text(generate_key_line(datetime.now(UTC)) + "\n")  # old line gone
    assert world.serve_until_exit(NOTIFY_SOCKET=str(notify.path)) == 78
    events = world.log_events()
    names = [e["event"] for e in events]
    assert names.count("pass.started") == 1
    at = names.index("error")  # the error line first, then why the service stops
    error, halt = events[at], events[at + 1]
    assert (error["error"], error["exit_code"], error["job"]) == ("UnknownKeyError", 78, "pass")
    assert halt["event"] == "service.config_stop"
    assert (halt["level"], halt["exit_code"], halt["key"]) == ("error", 78, "crypto.key_file")
    assert "read again, still lacks key id" in halt["hint"]
    assert (events[-2]["event"], events[-2]["exit_code"]) == ("service.stopped", 78)
    last = events[-1]  # the process's own end: the same error, without a job
    assert (last["event"], last["error"], last["exit_code"]) == ("error", "UnknownKeyError", 78)
    notify.drain()
    assert any(m.get("STATUS") == "stopping: configuration error" for m in notify.messages)
    with world.store() as store:
        after = {u.user: u.token for u in store.list_users()}
    assert after == before and all(token is not None for token in after.values())


def test_serve_takes_a_key_added_after_it_started_instead_of_stopping(
    world: Workspace, notify: NotifySocket
) -> None:
    """A token under a key line added after start makes serve reload its keys and read, not stop."""
    world.enroll(["alice"])
    world.configure(poll={"tick": "0.5s", "interval": "1s"})
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        new_line = generate_key_line(datetime.now(UTC))
        with world.key_file.open("a", encoding="utf-8") as keys:
            keys.write(new_line + "\n")  # step 1: the new key as the last line
        world.enroll(["bob"])  # written under the new key, which serve has not read
        reloaded = world.wait_for_event("service.keys_reloaded", proc)
        _wait_until_read(world, proc, {"bob"})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    assert reloaded["key_id"] == new_line.split(":", 1)[0]
    assert not any(e["event"] in {"error", "service.config_stop"} for e in world.log_events())


def _complete_lines(world: Workspace) -> list[str]:
    """The child's log lines written whole so far (a line being written is left out)."""
    text = world.log_file.read_text(encoding="utf-8")
    return text[: text.rfind("\n") + 1].splitlines()


def _wait_until_read(world: Workspace, proc: Spawned, users: set[str], *, since: int = 0) -> None:
    """Wait (20 s at most, the child alive) until each of `users` has a `poll.read` line
    with outcome ok among the complete log lines after the first `since`."""
    deadline = time.monotonic() + 20
    while missing := users - _read_ok(_complete_lines(world)[since:]):
        assert proc.poll() is None, f"serve exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"not read within 20 s: {sorted(missing)}"
        time.sleep(0.1)


def _read_ok(lines: list[str]) -> set[str]:
    events = [json.loads(line) for line in lines]
    return {e["user"] for e in events if e["event"] == "poll.read" and e["outcome"] == "ok"}
