#!/usr/bin/env python3
"""Set up the project's virtual environment and run its main jobs, with nothing but python3.

Usage:
    python3 dev.py demo        set up, then run the narrated demo (simulator + SQLite)
    python3 dev.py test        set up, then lint, type-check, check the layers and run the tests
    python3 dev.py bench [..]  set up, then run the benchmarks (arguments go to bench/run)
    python3 dev.py dist        set up, then build the wheel and sdist into dist/
    python3 dev.py lock [..]   set up, then refresh uv.lock and constraints.txt with uv
                               (arguments go to `uv lock`, e.g. --upgrade or -P NAME)
    python3 dev.py setup       only set up .venv (idempotent; reinstalls when pyproject.toml
                               or constraints.txt changes)

Extra arguments after `test` go to pytest (for example `python3 dev.py test -k vault`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".lta-installed"
# The versions CI tested, exported from uv.lock (`python3 dev.py lock`): pip installs exactly
# these, so that only python3 is needed and two installs on two days get the same packages.
CONSTRAINTS = ROOT / "constraints.txt"
# The uv that `lock` installs into .venv; uv is not needed for anything else.
UV_VERSION = "0.13.9"
EXPORT = (
    "export", "--quiet", "--format", "requirements-txt", "--all-extras", "--no-emit-project",
    "--no-hashes", "--frozen", "--output-file", "constraints.txt",
)  # fmt: skip


def _python() -> str:
    return str(BIN / "python")


def setup() -> None:
    """Create .venv and install the project with its dev extras, at the locked versions, when
    pyproject.toml or constraints.txt changed."""
    if sys.version_info < (3, 11):
        sys.exit(f"lta-worker needs Python >= 3.11; this is {sys.version.split()[0]}")
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    if not (BIN / "python").exists():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    print("dev.py: installing lta-worker and its dev tools into .venv", flush=True)
    pip = [_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(digest)


def lock(args: list[str]) -> None:
    """Refresh uv.lock from pyproject.toml (`uv lock ARGS`), then export constraints.txt."""
    uv = BIN / "uv"
    installed = ""
    if uv.exists():
        probe = [str(uv), "--version"]
        installed = subprocess.run(probe, capture_output=True, text=True, check=False).stdout
    if f"uv {UV_VERSION} " not in installed:
        pip = [_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        run(*pip, f"uv=={UV_VERSION}")
    run(str(uv), "lock", *args)
    run(str(uv), *EXPORT)


def dist() -> None:
    """Build the wheel and the sdist into dist/ with the locked build backend."""
    for old in (ROOT / "dist").glob("lta_worker-*"):
        old.unlink()
    run(_python(), "-m", "build", "--no-isolation", "--outdir", str(ROOT / "dist"), str(ROOT))


def run(*cmd: str) -> None:
    """Run one step; stop with its exit code when it fails."""
    print(f"dev.py: $ {' '.join(cmd)}", flush=True)
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    if code != 0:
        sys.exit(code)


def main(argv: list[str]) -> None:
    """Dispatch the sub-command."""
    what = argv[0] if argv else "help"
    rest = argv[1:]
    if what not in {"setup", "demo", "test", "bench", "dist", "lock"}:
        print(__doc__)
        sys.exit(0 if what in {"help", "-h", "--help"} else 2)
    setup()
    if what == "demo":
        os.execv(str(BIN / "lta-worker"), [str(BIN / "lta-worker"), "demo", *rest])
    elif what == "dist":
        dist()
    elif what == "lock":
        lock(rest)
    elif what == "bench":
        os.execv(_python(), [_python(), str(ROOT / "bench" / "run"), *rest])
    elif what == "test":
        run(_python(), "-m", "ruff", "check", ".")
        run(_python(), "-m", "ruff", "format", "--check", ".")
        run(_python(), "-m", "mypy")
        run(str(BIN / "lint-imports"))  # the layer contracts of pyproject.toml
        run(_python(), "-m", "pytest", *rest)


if __name__ == "__main__":
    main(sys.argv[1:])
