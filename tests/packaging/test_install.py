"""The wheel and sdist, built once from this checkout; the wheel installed once into a clean
venv at the locked versions, used first without and then with the `[simulator]` extra."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lta_worker import __version__
from lta_worker.buildinfo import git_commit
from lta_worker.errors import EX_CONFIG
from lta_worker.simulator import RunningSimulator
from support.process import Workspace, child_env, serve_simulator, write_private

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_FILES = sorted(p.name for p in (ROOT / "deploy").iterdir() if p.is_file())
SDIST_MUST_HOLD = ("LICENSE", "CHANGELOG.md", "constraints.txt", "uv.lock", "hatch_build.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class Installed:
    """A clean venv (no pip of its own) for the built wheel; calling it runs its `lta-worker`."""

    def __init__(self, tmp: Path, wheel: Path) -> None:
        self.tmp = tmp
        self.wheel = wheel
        self.venv = tmp / "venv"
        venv.EnvBuilder(with_pip=False).create(self.venv)
        self.python = self.venv / "bin" / "python"
        self.script = self.venv / "bin" / "lta-worker"

    def pip_install(self, extras: str = "") -> None:
        """`pip install -c constraints.txt WHEEL[extras]` into the venv, with the test's pip."""
        target = f"{self.wheel}{extras}"
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install", "-q",
             "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"), target],
            check=True, timeout=180, cwd=self.tmp,
        )  # fmt: skip

    def __call__(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.script), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=self.tmp,
            timeout=timeout,
            check=False,
        )

    def has(self, module: str) -> bool:
        probe = (
            f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        )
        return subprocess.run([str(self.python), "-c", probe], check=False).returncode == 0


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and, built from it, the wheel, as `python3 dev.py dist` builds them."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


@pytest.fixture
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A new venv for the wheel, nothing installed yet."""
    (wheel,) = dist.glob("lta_worker-*.whl")
    return Installed(tmp_path_factory.mktemp("installed"), wheel)


@pytest.fixture
def served() -> Iterator[RunningSimulator]:
    """A simulator served by the test process (the installed copy has none yet)."""
    with serve_simulator() as running:
        yield running


def _expected_commit() -> str | None:
    return git_commit(ROOT)


def test_archives_carry_what_an_operator_needs(dist: Path) -> None:
    """The wheel holds deploy/, the build's commit and the licence; the sdist the lock files."""
    (wheel,) = dist.glob("lta_worker-*.whl")
    (sdist,) = dist.glob("lta_worker-*.tar.gz")
    assert wheel.name == f"lta_worker-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in DEPLOY_FILES:
            packaged = archive.read(f"lta_worker/deploy/{name}")
            assert packaged == (ROOT / "deploy" / name).read_bytes(), name
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
        info = archive.read("lta_worker/_build_info.py").decode()
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        held = set(archive.getnames())
    for name in SDIST_MUST_HOLD:
        assert f"{top}/{name}" in held, name
    assert f"{top}/src/lta_worker/_build_info.py" in held
    commit = _expected_commit()
    if commit is not None:
        assert f"COMMIT = {commit!r}" in info


def test_installed_copy_without_then_with_the_simulator_extra(
    installed: Installed, served: RunningSimulator, tmp_path: Path
) -> None:
    """The bare install runs every operator command; with [simulator], `simulator serve` too."""
    installed.pip_install()
    assert not installed.has("starlette")
    assert not installed.has("uvicorn")
    assert not installed.has("pytest")

    version = installed("-V")
    assert version.returncode == 0, version.stderr
    commit = _expected_commit() or "unknown"
    assert version.stdout.strip() == f"lta-worker {__version__} (commit {commit})"

    no_sim = installed("simulator", "serve", "--port", "0")
    assert no_sim.returncode == EX_CONFIG
    assert "pip install 'lta-worker[simulator]'" in no_sim.stderr

    dest = tmp_path / "deploy"
    written = installed("deploy-files", "--dest", str(dest))
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in dest.iterdir()) == DEPLOY_FILES
    assert os.access(dest / "lta-worker-admin", os.X_OK)

    keys = installed("keys", "generate")
    assert keys.returncode == 0, keys.stderr
    world = Workspace(served, tmp_path / "world")
    write_private(world.key_file, keys.stdout)  # the installed copy's own key line
    config = world.config
    served.sim.add_user("ada")
    served.sim.queue_consent("ada", None)

    for args, stdin in (
        (("db", "upgrade"), None),
        (("enroll", "url", "--user", "ada"), None),
    ):
        done = installed("--config", str(config), *args, stdin=stdin)
        assert done.returncode == 0, done.stderr
    consent = httpx.get(done.stdout.strip(), follow_redirects=False)
    assert consent.status_code == 302, consent.text
    finish = installed(
        "--config", str(config), "enroll", "finish", "--user", "ada",
        stdin=consent.headers["location"] + "\n",
    )  # fmt: skip
    assert finish.returncode == 0, finish.stderr

    run = installed("--config", str(config), "run")
    assert run.returncode == 0, run.stderr
    check = installed("--config", str(config), "check")
    assert check.returncode == 0, check.stdout + check.stderr
    exported = installed("--config", str(config), "results", "export", "--user", "ada")
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted((r["user"], r["endpoint"], r["status"]) for r in rows) == [
        ("ada", "latest-change", "ok"),
        ("ada", "stats", "ok"),
    ]

    installed.pip_install("[simulator]")  # the same venv: only the extra's packages are added
    proc = subprocess.Popen(
        [str(installed.script), "simulator", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.fullmatch(r"base_url\s+= (http://127\.0\.0\.1:\d+)\n", first)
        assert match is not None, first + (proc.stderr.read() if proc.stderr else "")
        answer = httpx.get(f"{match[1]}/api/v1/history/latest-change")
        assert answer.status_code == 401  # no credential: the service's own answer
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # also closes the pipes
    assert proc.returncode == 0, err
