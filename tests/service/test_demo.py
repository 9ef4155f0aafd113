"""`lta-worker demo` as a new user runs it: a child process, its narration and its directory."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lta_worker.simulator import DEMO_CLIENT_SECRET
from support.process import child_env


@pytest.mark.timeout(60)
def test_demo_narrates_and_leaves_a_usable_directory(tmp_path: Path) -> None:
    """The demo exits 0 and narrates its story, prints no secret, and leaves a usable config."""
    directory = tmp_path / "demo"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lta_worker", "demo", "--dir", str(directory)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=55,
        check=False,
    )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 55
    assert done.stderr == ""
    out = " ".join(done.stdout.split())  # the narration is wrapped: match across lines

    assert "20 users enrolled" in out
    assert out.count("Answers 429 (too many requests): 0.") == 3
    assert "429 (too many requests): 1" not in out
    windows = re.search(r"Requests per 10 s window: ([\d, ]+), never more", out)
    assert windows is not None
    assert max(int(n) for n in windows.group(1).split(", ")) <= 27  # 30 less the reserve
    assert "latest-change answered 404, stored as `none`" in out
    assert "only stats was called" in out
    assert "403 CloudSyncInactive, so she is parked" in out
    assert "401 NoCloudSyncLinked, so he is unlinked" in out
    assert "401 PermanentAccessRevoked. The worker deleted his token at once" in out
    assert "state revoked, token held: no" in out
    assert "hedy was not called" in out
    assert "she is active again" in out
    assert "lta-worker status" in out
    assert "simulator serve --port" in out
    assert "does not know these users or their tokens" in out

    for secret_text in (done.stdout, (directory / "worker.log").read_text()):
        assert DEMO_CLIENT_SECRET not in secret_text
        assert "dspa_" not in secret_text
    for name in ("client-secret", "token-keys"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    events = [json.loads(line) for line in (directory / "worker.log").read_text().splitlines()]
    assert [e["event"] for e in events].count("pass.finished") == 3
    assert sum(e["throttled"] for e in events if e["event"] == "pass.finished") == 0

    config = directory / "config.toml"
    command = ["users", "list", "--format", "json"]
    listed = subprocess.run(
        [sys.executable, "-m", "lta_worker", "--config", str(config), *command],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=30,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    users = {u["user"]: u for u in json.loads(listed.stdout)}
    assert len(users) == 20
    assert (users["ken"]["state"], users["ken"]["has_token"]) == ("revoked", False)
    assert (users["hedy"]["state"], users["hedy"]["has_token"]) == ("active", True)
    assert users["claude"]["state"] == "unlinked"
    assert users["marie"]["scopes"] == ["cloud-sync.permanent.stats"]
