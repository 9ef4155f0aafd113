#!/usr/bin/env python3
"""Set up the project's virtual environment and run its main jobs, with nothing but python3.

Usage:
    python3 dev.py demo        set up, then run the narrated demo (simulator + SQLite)
    python3 dev.py test        set up, then lint, type-check, check the layers and run the tests
    python3 dev.py bench [..]  set up, then run the benchmarks (arguments go to bench/run)
    python3 dev.py dist        set up, then build the wheel and sdist into dist/
    python3 dev.py lock [..]   set up, then refresh uv.lock and constraints.txt with uv
                               (arguments go to `uv lock`, e.g. --upgrade or -P NAME)
    python3 dev.py mutate [..] set up, then measure the mutation score with mutmut, niced, from
                               scratch: [tool.mutmut] in pyproject.toml names the code mutated
                               (domain/, pacing/, storage's fencing and lease code) and the tests
                               run; arguments go to `mutmut run` (default --max-children 1;
                               --report-only summarises the last run again). Prints the score per
                               package and writes .mutation/summary.txt with the survivors
    python3 dev.py setup       only set up .venv (idempotent; reinstalls when pyproject.toml
                               or constraints.txt changes)

Extra arguments after `test` go to pytest (for example `python3 dev.py test -k vault`); the tests
run in one process per core (pytest-xdist) unless they say otherwise (`-n 0`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
import venv
from collections import Counter, defaultdict
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


def mutate(args: list[str]) -> None:
    """Run mutmut from scratch (its cached verdicts do not see a changed test), then summarise."""
    elapsed = None
    if args != ["--report-only"]:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        started = time.monotonic()
        run("nice", "-n", "19", str(BIN / "mutmut"), "run", "--max-children", "1", *args)
        elapsed = time.monotonic() - started
    if not (ROOT / "mutants").is_dir():
        sys.exit("dev.py: no mutmut run to report; run `python3 dev.py mutate` first")
    listing = subprocess.run(
        [str(BIN / "mutmut"), "results", "--all", "true"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    verdicts = dict(line.strip().rsplit(": ", 1) for line in listing.splitlines() if ": " in line)
    lines = [*_mutation_table(verdicts, elapsed), "", "Not killed, by module (`mutmut show NAME`):"]
    by_module: dict[str, list[str]] = defaultdict(list)
    for name, verdict in sorted(verdicts.items()):
        if verdict not in {"killed", "timeout", *_UNCHECKED}:
            module, mutant = name.rsplit(".", 1)
            by_module[module].append(f"    {mutant}  {verdict}")
    for module, mutants in by_module.items():
        lines += [f"{module} ({len(mutants)})", *mutants]
    out = ROOT / ".mutation" / "summary.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"dev.py: survivors by module in {out.relative_to(ROOT)}")


_COLUMNS = ("killed", "survived", "timeout", "no tests")
_UNCHECKED = {"not checked", "check was interrupted by user"}


def _mutation_table(verdicts: dict[str, str], elapsed: float | None) -> list[str]:
    """The verdicts per package and in total, with the score (killed and timed out over the
    mutants checked, untested ones included) and the machine it ran on."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for name, verdict in verdicts.items():
        counts[name.split(".")[1]][verdict] += 1
    rows = {**dict(sorted(counts.items())), "total": sum(counts.values(), Counter())}
    info = Path("/proc/cpuinfo")
    models = [ln for ln in info.read_text().splitlines() if ln.startswith("model name")]
    cpu = models[0].split(":", 1)[1].strip() if models else platform.machine()
    head = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(head, cwd=ROOT, capture_output=True, text=True, check=False).stdout
    checked = sum(v not in _UNCHECKED for v in verdicts.values())
    rate = "" if elapsed is None else f", {checked / elapsed * 60:.1f} mutants/min"
    lines = [
        f"mutation score at {commit.strip()}: nproc {os.cpu_count()}, {cpu}, "
        f"Python {platform.python_version()}{rate}",
        "score = (killed + timeout) / checked; no tests: no test it runs reaches it",
        "".join(f"{h:>10}" for h in ("package", *_COLUMNS, "other", "checked", "score")),
    ]
    for package, c in rows.items():
        checked = c.total() - sum(c[k] for k in _UNCHECKED)
        other = checked - sum(c[k] for k in _COLUMNS)
        score = (c["killed"] + c["timeout"]) / checked * 100 if checked else 0.0
        cells = [package, *(str(c[k]) for k in _COLUMNS), str(other), str(checked)]
        lines.append("".join(f"{cell:>10}" for cell in cells) + f"{score:9.1f} %")
    if unchecked := sum(rows["total"][k] for k in _UNCHECKED):
        lines.append(f"not checked (a run stopped or a subset): {unchecked}")
    print("\n".join(lines), flush=True)
    return lines


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
    if what not in {"setup", "demo", "test", "bench", "dist", "lock", "mutate"}:
        print(__doc__)
        sys.exit(0 if what in {"help", "-h", "--help"} else 2)
    setup()
    if what == "demo":
        os.execv(str(BIN / "lta-worker"), [str(BIN / "lta-worker"), "demo", *rest])
    elif what == "dist":
        dist()
    elif what == "lock":
        lock(rest)
    elif what == "mutate":
        mutate(rest)
    elif what == "bench":
        os.execv(_python(), [_python(), str(ROOT / "bench" / "run"), *rest])
    elif what == "test":
        run(_python(), "-m", "ruff", "check", ".")
        run(_python(), "-m", "ruff", "format", "--check", ".")
        run(_python(), "-m", "mypy")
        run(str(BIN / "lint-imports"))  # the layer contracts of pyproject.toml
        run(_python(), "-m", "pytest", *_workers(rest), *rest)


def _workers(rest: list[str]) -> list[str]:
    """One pytest process per core (pytest-xdist), a test file to one process (its module
    fixtures start once); none when the arguments choose (`-n 0`, `-p no:xdist`)."""
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in rest)
    return [] if chosen else ["-n", "auto", "--dist", "loadfile"]


if __name__ == "__main__":
    main(sys.argv[1:])
