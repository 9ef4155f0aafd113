"""Every ```sh block of README.md and docs/*.md runs here in a temporary directory against the
simulator (machine paths moved, `lta-worker-admin` as `lta-worker --config CFG`) and does
what its text says, or is listed with why it cannot."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from support.docs import fenced
from support.process import Workspace as World
from support.process import child_env, free_port, serve_simulator, stop, wait_for, write_private
from support.prometheus import http_get

# Blocks that cannot run here, by the start of their text: why.
NOT_RUN = {
    "python3 dev.py demo": "the narrated demo and the whole suite: minutes, not a test's",
    "python3 dev.py dist": "builds the wheel: tests/packaging/test_install.py does",
    "python3 -m venv /opt/lta-worker": "installs the wheel's dependencies from an index",
    "PIPX_HOME=": "installs the wheel's dependencies from an index",
    "lta-worker deploy-files --dest /usr/local/share/lta-worker --force": (
        "diffs against units installed in /etc/systemd"
    ),
    "python3 dev.py lock": "resolves against an index (the network)",
    "cd /usr/local/share/lta-worker\ncp lta-worker.service": "systemctl: installs and starts units",
    "systemd-run --quiet --wait": "systemd-run: a transient unit",
    "pip install 'lta-worker[web]'": "installs from an index (the network)",
    "createuser lta_worker": "creates a role on a PostgreSQL server (its administrator's)",
    "*/15 * * * *": "a crontab line (deploy/cron.example), not a command",
}


# Blocks started in the background by a fixture, for the blocks that use them.
SERVED = {"lta-worker simulator serve --port 8765": "sim_on_free_port, for the curl block"}


@dataclass
class Ctx:
    """Where a block runs: its directory, the simulator's world, the served simulator's port."""

    tmp: Path
    world: World
    port: int | None = None


Step = Callable[[Ctx, str], None]


@dataclass
class Case:
    """A block's run: the machine it needs, and what the surrounding text promises."""

    prepare: Callable[[Ctx], None] | None = None
    # The block is cut before the first line holding this; `between` runs in the cut.
    cut: str | None = None
    between: Step | None = None
    stdout: str = ""
    check: Step | None = None


def enrolled_and_read(ctx: Ctx) -> None:
    """One user enrolled and read once: a result to export, a healthy status."""
    ctx.world.enroll(["ada"])
    assert ctx.world.cli("run").returncode == 0


def consent_given(ctx: Ctx, stdout: str) -> None:
    """The user consents at the printed URL; the browser's redirect lands in redirect.txt."""
    url = stdout.strip().splitlines()[-1]
    ctx.world.sim.queue_consent("alice", None)
    answer = httpx.get(url, follow_redirects=False)
    assert answer.status_code == 302, answer.text
    (ctx.tmp / "redirect.txt").write_text(answer.headers["location"] + "\n", encoding="utf-8")


def with_link_key(ctx: Ctx) -> None:
    """`enroll link` needs `enroll.public_url` and a link key file."""
    key = write_private(ctx.tmp / "link-key", "k" * 43 + "\n")
    ctx.world.extra = f'[enroll]\npublic_url = "https://app.example/lta"\nlink_key_file = "{key}"\n'
    ctx.world.write_config()


def set_up(ctx: Ctx) -> None:
    """An installation `check` checks: its database set up (`db upgrade`)."""
    ctx.world.store().close()


def with_user_alice(ctx: Ctx) -> None:
    """`enroll url` for an account the service has."""
    ctx.world.sim.add_user("alice")


def with_user_ada_served(ctx: Ctx) -> None:
    """The served simulator has the account the block revokes."""
    url = f"http://127.0.0.1:{ctx.port}/_sim/users"
    assert httpx.post(url, json={"user": "ada"}).status_code == 201


def faults_and_revoke(ctx: Ctx, stdout: str) -> None:
    """One 503 rule is in force, and the revocation answered."""
    rules = httpx.get(f"http://127.0.0.1:{ctx.port}/_sim/faults").json()["rules"]
    assert [r["kind"] for r in rules] == ["503"]
    assert '"revoked"' in stdout


def quiet(ctx: Ctx, stdout: str) -> None:
    """Healthy: nothing printed (the JSON goes to /dev/null, no "unhealthy")."""
    assert stdout == ""


def deployed(ctx: Ctx, stdout: str) -> None:
    """The example config is in place to edit, the admin script installed."""
    tmp = ctx.tmp
    assert (tmp / "etc" / "config.toml").read_text(encoding="utf-8").startswith("#")
    assert os.access(tmp / "sbin" / "lta-worker-admin", os.X_OK)


def secrets_written(ctx: Ctx, stdout: str) -> None:
    """Both files private; the secret read from stdin; the key file one the worker uses."""
    tmp, world = ctx.tmp, ctx.world
    for name in ("token-keys", "client-secret"):
        assert stat.S_IMODE((tmp / "etc" / name).stat().st_mode) == 0o600
    assert (tmp / "etc" / "client-secret").read_text(encoding="utf-8") == "s3cret\n"
    world.key_file = tmp / "etc" / "token-keys"  # the key file generated is a key file
    world.write_config()
    assert world.cli("keys", "rotate").returncode == 0


def cursor_kept(ctx: Ctx, stdout: str) -> None:
    """The export holds the user's result; the cursor file the next cursor."""
    tmp = ctx.tmp
    lines = (tmp / "changes.jsonl").read_text(encoding="utf-8").splitlines()
    assert any(json.loads(line).get("user") == "ada" for line in lines[:-1])
    kept = (tmp / "app" / "lta-cursor").read_text(encoding="utf-8").strip()
    assert json.loads(lines[-1]) == {"cursor": kept}


def keyed_and_enrolled(ctx: Ctx) -> None:
    """The key file where the unit's credential comes from, a user's token stored under it."""
    keys = ctx.tmp / "etc" / "token-keys"
    keys.write_bytes(ctx.world.key_file.read_bytes())
    keys.chmod(0o600)
    ctx.world.key_file = keys
    ctx.world.write_config()
    ctx.world.enroll(["ada"])


def rotated(ctx: Ctx, stdout: str) -> None:
    """Only the new key is left, the service restarted twice, and the re-encrypted token reads."""
    world = ctx.world
    lines = world.key_file.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    assert (ctx.tmp / "systemctl.log").read_text(encoding="utf-8").splitlines() == [
        "restart lta-worker.service"
    ] * 2
    before = len(world.sim.requests())
    done = world.cli("run")
    assert done.returncode == 0, done.stderr
    assert [e.status for e in world.sim.requests()[before:]] == [200, 200]


def webhook_secret(ctx: Ctx, stdout: str) -> None:
    """A `whsec_` secret in a private file."""
    path = ctx.tmp / "etc" / "webhook-secret"
    assert path.read_text(encoding="utf-8").startswith("whsec_")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# Blocks that run here, by the start of their text: how, and what the text promises.
RUN = {
    "lta-worker deploy-files --dest /usr/local/share/lta-worker\n": Case(check=deployed),
    "# Token key file": Case(check=secrets_written),
    "lta-worker-admin db upgrade": Case(
        prepare=with_user_alice,
        cut="enroll finish",
        between=consent_given,
        stdout="alice",
    ),
    "lta-worker enroll link --user 42": Case(
        prepare=with_link_key, stdout="https://app.example/lta/enroll/start?link="
    ),
    "cursor=$(cat /var/lib/app/lta-cursor": Case(prepare=enrolled_and_read, check=cursor_kept),
    "lta-worker-admin status --check --format json": Case(prepare=enrolled_and_read, check=quiet),
    "lta-worker-admin check\n": Case(prepare=set_up, stdout="ok    database"),
    "python3 -c \"import base64, os; print('whsec_'": Case(check=webhook_secret),
    "# 1. Add a new key as the LAST line": Case(prepare=keyed_and_enrolled, check=rotated),
    "curl -s -X POST localhost:8765/_sim/faults": Case(
        prepare=with_user_ada_served, check=faults_and_revoke
    ),
}


BLOCKS = fenced("sh")


def _matches(table: Mapping[str, object], block: str) -> list[str]:
    return [start for start in table if block.startswith(start)]


def test_every_block_is_run_or_excused() -> None:
    """Each block starts with exactly one entry of RUN, NOT_RUN or SERVED; each entry a block."""
    problems = [
        (where, found)
        for where, block in BLOCKS.items()
        if len(found := _matches(RUN, block) + _matches(NOT_RUN, block) + _matches(SERVED, block))
        != 1
    ]
    assert problems == [], "a block in no list (or in two): add it to RUN or NOT_RUN"
    listed: dict[str, object] = {**RUN, **NOT_RUN, **SERVED}
    used = {s for b in BLOCKS.values() for s in _matches(listed, b)}
    assert sorted(set(listed) - used) == [], "starts of no block"


@pytest.fixture
def sim_on_free_port() -> Iterator[int]:
    """docs/simulator.md's `lta-worker simulator serve` block, on a free port, not 8765."""
    port = free_port()
    (block,) = [b for b in BLOCKS.values() if _matches(SERVED, b)]
    command = shlex.split(block.replace("8765", str(port)))
    assert command[0] == "lta-worker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lta_worker", *command[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{port}/_sim/")[0] == 200, timeout=20)
        yield port
    finally:
        stop(proc)


def _shims(tmp: Path, world: World) -> Path:
    """Stand-ins on PATH: this checkout's lta-worker, lta-worker-admin, systemctl, $EDITOR."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    main = f'exec {sys.executable} -m lta_worker "$@"\n'
    admin = f'exec {sys.executable} -m lta_worker --config {world.config} "$@"\n'
    systemctl = f'echo "$*" >> {tmp / "systemctl.log"}\n'
    editor = 'sed -i 1d "$1"\n'
    for name, body in (
        ("lta-worker", main),
        ("lta-worker-admin", admin),
        ("systemctl", systemctl),
        ("edit-drop-first-line", editor),
    ):
        (bin_dir / name).write_text("#!/bin/sh\n" + body, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _localised(block: str, tmp: Path, port: int | None) -> str:
    """The block with the machine's paths moved into `tmp` (and the simulator's port)."""
    for path, local in (
        ("/etc/lta-worker", tmp / "etc"),
        ("/usr/local/share/lta-worker", tmp / "share"),
        ("/usr/local/sbin", tmp / "sbin"),
        ("/var/lib/app", tmp / "app"),
        ("/tmp/changes.jsonl", tmp / "changes.jsonl"),
    ):
        block = block.replace(path, str(local))
    return block.replace("8765", str(port)) if port else block


def _bash(script: str, tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp,
        input="s3cret\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("where", sorted(w for w, b in BLOCKS.items() if _matches(RUN, b)))
def test_block_runs_and_does_what_its_text_says(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The block exits 0 against the simulator and prints and leaves what its text promises."""
    block = BLOCKS[where]
    case = RUN[_matches(RUN, block)[0]]
    port = request.getfixturevalue("sim_on_free_port") if "8765" in block else None
    with serve_simulator() as running:
        (tmp_path / "world").mkdir()
        for name in ("etc", "app", "sbin"):  # directories a machine has
            (tmp_path / name).mkdir()
        world = World(running, tmp_path / "world")
        ctx = Ctx(tmp_path, world, port)
        if case.prepare:
            case.prepare(ctx)
        env = child_env(
            PATH=f"{_shims(tmp_path, world)}:{os.environ['PATH']}",
            LTA_WORKER_CONFIG=str(world.config),
            EDITOR="edit-drop-first-line",
        )
        script = _localised(block, tmp_path, port)
        parts = [script]
        if case.cut:
            at = script.index(case.cut)
            at = script.rindex("\n", 0, at) + 1
            parts = [script[:at], script[at:]]
        out = ""
        for i, part in enumerate(parts):
            done = _bash(part, tmp_path, env)
            assert done.returncode == 0, (where, done.stdout, done.stderr)
            out += done.stdout
            if i == 0 and case.between:
                case.between(ctx, done.stdout)
        assert case.stdout in out, (where, out)
        if case.check:
            case.check(ctx, out)
