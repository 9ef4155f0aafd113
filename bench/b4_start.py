"""B4 start: `lta-worker run` with nothing due, as cron or a timer starts it; and `status`.

A migrated SQLite database holds a few users, none due; config, key file and client secret
are valid. Each run is a new process (`.venv/bin/lta-worker --config C run`), timed from
spawn to exit: the median of several runs. For context: the bare interpreter's start
(`python -c pass`), and the time to import the CLI alone. `python -X importtime` of one
run gives the imports that cost most, grouped by top-level package (a package's
cumulative time includes what it imports itself); and each heavy library is imported on
its own in a fresh interpreter, to see what trimming one of them would save.
"""

from __future__ import annotations

import json
import resource
import secrets
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import PYTHON, BenchResult, Size, Workspace, log, median, store_tokens

# What a run may spend time on, each timed in a fresh interpreter: (label, setup, statement).
# A library's time includes the standard modules it is the first to import.
FRESH = (
    ("import sqlalchemy", "", "import sqlalchemy"),
    ("import sqlalchemy.orm (after sqlalchemy)", "import sqlalchemy", "import sqlalchemy.orm"),
    ("import httpx", "", "import httpx"),
    ("httpx client: import httpcore, CA bundle", "import httpx", "httpx.AsyncClient()"),
    ("import anyio", "", "import anyio"),
    ("import cryptography AESGCM", "", "import cryptography.hazmat.primitives.ciphers.aead"),
    ("import structlog", "", "import structlog"),
    ("import click", "", "import click"),
    ("import alembic (not on the run path)", "", "import alembic"),
    ("import uvicorn (not on the run path)", "", "import uvicorn"),
    ("import apscheduler (not on the run path)", "", "import apscheduler.schedulers"),
)
HEAVY_ROOTS = ("alembic", "uvicorn", "starlette", "apscheduler", "psycopg")
RUN_TIMEOUT_S = 60.0


def _script() -> str:
    """The `lta-worker` console script next to this interpreter."""
    candidate = Path(PYTHON).with_name("lta-worker")
    if not candidate.exists():
        raise RuntimeError(f"{candidate} not found: install the project (python3 dev.py setup)")
    return str(candidate)


def compile_package() -> str:
    """Compile the package's bytecode before timing, as an install does.

    pip compiles an installed package's modules at install time; a source tree run with
    PYTHONDONTWRITEBYTECODE=1 (as on the machines this runs on) has none, and every start
    would compile the ~80 modules of lta_worker a command imports again (about 60 ms of a
    `run`, 30 ms of a `status`): a cost no installation pays.
    """
    import compileall

    import lta_worker

    package = Path(lta_worker.__file__).parent
    compileall.compile_dir(package, quiet=1)
    return str(package)


def _cpu_wall(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds and CPU seconds (user + system) of `cmd` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, proc = _wall(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, proc


def _wall(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    return time.perf_counter() - t0, proc


def importtime(cmd: list[str]) -> dict[str, Any]:
    """Parse `-X importtime`: total, top-level packages by cumulative ms, and the raw top."""
    _, proc = _wall([PYTHON, "-X", "importtime", *cmd])
    rows: list[tuple[int, int, str, int]] = []  # self us, cumulative us, module, depth
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        _, rest = line.split(":", 1)
        own, cumulative, name = rest.split("|")
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((int(own), int(cumulative), name.strip(), depth))
    by_root: dict[str, int] = defaultdict(int)
    # A package's cost is the cumulative time of its outermost imports: an entry counts
    # unless an enclosing entry of the same package already holds it.
    stack: list[tuple[int, str]] = []
    for _own, cumulative_us, module, depth in reversed(rows):
        # -X importtime prints a module after its children: walk backwards to see parents first.
        while stack and stack[-1][0] >= depth:
            stack.pop()
        root = module.split(".")[0]
        if not any(parent_root == root for _, parent_root in stack):
            by_root[root] += cumulative_us
        stack.append((depth, root))
    own_code = sum(own for own, _, name, _ in rows if name.split(".")[0] == "lta_worker")
    top = sorted(
        ((k, v) for k, v in by_root.items() if k != "lta_worker"),
        key=lambda kv: kv[1],
        reverse=True,
    )
    return {
        "total_ms": round(sum(r[0] for r in rows) / 1000, 1),
        "modules": len(rows),
        "lta_worker_self_ms": round(own_code / 1000, 1),
        "top_packages_ms": [[name, round(us / 1000, 1)] for name, us in top[:12]],
        "not_needed_but_imported": sorted(name for name in HEAVY_ROOTS if name in by_root),
        "roots": sorted(by_root),
    }


SPLIT = """
import json, sys, time
t0 = time.perf_counter()
from lta_worker.cli import main
t1 = time.perf_counter()
import anyio
import lta_worker.storage
import lta_worker.worker
t2 = time.perf_counter()
try:
    main(["--config", sys.argv[1], "run"])
except SystemExit as exc:
    code = exc.code
t3 = time.perf_counter()
print(json.dumps({"cli_import_s": t1 - t0, "run_imports_s": t2 - t1, "work_s": t3 - t2,
                  "exit": code}))
"""


def split(config: Path) -> dict[str, Any]:
    """One run in a fresh interpreter, split into: CLI import, run-path imports, the rest."""
    _, proc = _wall([PYTHON, "-c", SPLIT, str(config)])
    if proc.returncode != 0:
        raise RuntimeError(f"split run failed: {proc.stderr[-1000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


# The same run through `python -c`, as is and with two start-up tweaks the CLI could make
# (what-ifs: the source is not changed). `os._exit` after flushing skips the interpreter's
# teardown of every imported module; `gc.disable()` spares the cyclic collector the
# hundreds of thousands of objects that imports create (a one-shot process can leave it off).
_MAIN = "from lta_worker.cli import main\nmain(['--config', sys.argv[1], 'run'])\n"
_FAST_EXIT = (
    "from lta_worker.cli import main\n"
    "try:\n    main(['--config', sys.argv[1], 'run'])\n"
    "except SystemExit as exc:\n"
    "    sys.stdout.flush(); sys.stderr.flush(); os._exit(exc.code or 0)\n"
)
WHAT_IF = {
    "as is (python -c)": "import sys\n" + _MAIN,
    "os._exit after flushing": "import os, sys\n" + _FAST_EXIT,
    "gc disabled": "import gc, sys\ngc.disable()\n" + _MAIN,
    "both": "import gc, os, sys\ngc.disable()\n" + _FAST_EXIT,
}


def what_ifs(config: Path, runs: int) -> dict[str, float]:
    """Median wall seconds of each WHAT_IF variant, runs interleaved."""
    walls: dict[str, list[float]] = {name: [] for name in WHAT_IF}
    for _ in range(runs):
        for name, code in WHAT_IF.items():
            wall, proc = _wall([PYTHON, "-c", code, str(config)])
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: exited {proc.returncode}: {proc.stderr[-500:]}")
            walls[name].append(wall)
    return {name: median(values) for name, values in walls.items()}


def dev_only_modules() -> list[str]:
    """Top-level modules of the installed distributions that a production install lacks.

    The venv holds the development tools too, and some libraries import what they find:
    structlog imports rich (brought by import-linter), httpcore imports trio (brought by
    the tests). A production install (`pip install lta-worker`) has only the dependency
    closure of the project without extras; everything else is listed here.
    """
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted: set[str] = set()
    todo = ["lta-worker"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in wanted:
            continue
        wanted.add(name)
        try:
            texts = requires(name) or []
        except PackageNotFoundError:
            continue
        for text in texts:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(
        module
        for module, dists in packages_distributions().items()
        if not module.startswith("_") and not any(canonicalize_name(d) in wanted for d in dists)
    )


def _hiding(hidden: list[str]) -> str:
    """Code that makes `hidden` top-level modules unimportable, as if not installed."""
    return (
        "import sys\n"
        f"HIDDEN = frozenset({hidden!r})\n"
        "class _Hidden:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in HIDDEN:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Hidden())\n"
    )


_COMMAND = (
    "import sys\nfrom lta_worker.cli import main\nmain(['--config', sys.argv[1], *sys.argv[2:]])\n"
)


def production_set(config: Path, runs: int, hidden: list[str]) -> dict[str, dict[str, float]]:
    """Median wall seconds of `run` and `status` through `python -c`, as is and with the
    development-only packages hidden (interleaved)."""
    variants = {"as is": _COMMAND, "production packages": _hiding(hidden) + _COMMAND}
    walls: dict[str, dict[str, list[float]]] = {
        cmd: {name: [] for name in variants} for cmd in ("run", "status")
    }
    for _ in range(runs):
        for cmd, by_variant in walls.items():
            for name, code in variants.items():
                wall, proc = _wall([PYTHON, "-c", code, str(config), cmd])
                if proc.returncode != 0:
                    raise RuntimeError(f"{cmd} ({name}): exit {proc.returncode}: {proc.stderr}")
                by_variant[name].append(wall)
    return {
        cmd: {name: median(values) for name, values in by_variant.items()}
        for cmd, by_variant in walls.items()
    }


def fresh(setup: str, statement: str) -> float | None:
    """Milliseconds `statement` takes after `setup` in a fresh interpreter (None: it failed)."""
    code = (
        f"import time\n{setup}\nt = time.perf_counter()\n{statement}\n"
        "print(1000 * (time.perf_counter() - t))"
    )
    _, proc = _wall([PYTHON, "-c", code])
    if proc.returncode != 0:
        return None
    return float(proc.stdout.strip())


def run(size: Size) -> BenchResult:
    """Run B4 and return its figures."""
    runs = {"full": 15, "quick": 5, "smoke": 1}[size]
    result = BenchResult("B4", "start: `lta-worker run` with nothing due, and `status`")
    with Workspace("b4") as ws:
        base = "http://127.0.0.1:9"  # never contacted: nobody is due
        settings = ws.settings(base, base + "/auth")
        config = ws.write_config(base, base + "/auth")
        later = datetime.now(UTC) + timedelta(days=1)
        tokens = [(f"s-{i}", "dspa_" + secrets.token_urlsafe(32)) for i in range(5)]
        store_tokens(settings, tokens, due_at=later)
        cmd = [_script(), "--config", str(config), "run"]
        compiled = compile_package()
        _wall(cmd)  # warm the page cache: cron runs a warm machine too
        status_cmd = [_script(), "--config", str(config), "status"]
        walls: list[float] = []
        cpus: list[float] = []
        status_walls: list[float] = []
        status_cpus: list[float] = []
        for _ in range(runs):  # alternated, so that both see the same load
            for command, wall_list, cpu_list in (
                (cmd, walls, cpus),
                (status_cmd, status_walls, status_cpus),
            ):
                wall, cpu, proc = _cpu_wall(command)
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"{command[-1]} exited {proc.returncode}: {proc.stderr[-1000:]}"
                    )
                wall_list.append(wall)
                cpu_list.append(cpu)
        python_walls = [_wall([PYTHON, "-c", "pass"])[0] for _ in range(runs)]
        cli_code = "import lta_worker.cli"
        import_walls = [_wall([PYTHON, "-c", cli_code])[0] for _ in range(runs)]
        times = importtime(cmd)
        splits = [split(config) for _ in range(runs)]
        tweaks = what_ifs(config, runs)
        hidden = dev_only_modules()
        production = production_set(config, runs, hidden)
    alone = {label: fresh(setup, stmt) for label, setup, stmt in FRESH}
    log(f"B4: run median {1000 * median(walls):.0f} ms over {runs} runs")
    result.details = {
        "runs": runs,
        "run_s": [round(w, 3) for w in walls],
        "status_s": [round(w, 3) for w in status_walls],
        "run_cpu_s": [round(c, 3) for c in cpus],
        "status_cpu_s": [round(c, 3) for c in status_cpus],
        "python_startup_median_s": median(python_walls),
        "cli_import_median_s": median(import_walls),
        "split_median_s": {
            key: median(s[key] for s in splits)
            for key in ("cli_import_s", "run_imports_s", "work_s")
        },
        "what_if_median_s": tweaks,
        "production_packages_median_s": production,
        "dev_only_modules": hidden,
        "importtime": times,
        "fresh_interpreter_ms": {k: None if v is None else round(v, 1) for k, v in alone.items()},
        "python": sys.version.split()[0],
        "bytecode_compiled_before_timing": compiled,
    }
    result.add(
        "run, nothing due (wall)",
        1000 * median(walls),
        "ms",
        at_most=500,
        note=f"median of {runs}; min {1000 * min(walls):.0f}, max {1000 * max(walls):.0f}; "
        f"CPU (user + sys) median {1000 * median(cpus):.0f}",
    )
    result.add(
        "status (wall)",
        1000 * median(status_walls),
        "ms",
        at_most=300,
        note=f"median of {runs}; min {1000 * min(status_walls):.0f}, "
        f"max {1000 * max(status_walls):.0f}; "
        f"CPU (user + sys) median {1000 * median(status_cpus):.0f}",
    )
    result.add("python -c pass", 1000 * median(python_walls), "ms", note="interpreter alone")
    result.add("import the CLI and its commands", 1000 * median(import_walls), "ms")
    parts = result.details["split_median_s"]
    result.add(
        "  in-process: CLI import / run imports / work",
        f"{1000 * parts['cli_import_s']:.0f} / {1000 * parts['run_imports_s']:.0f} / "
        f"{1000 * parts['work_s']:.0f}",
        "ms",
        note="work: settings, store, lock, vault, pass, bookkeeping (no HTTP client: nobody due)",
    )
    result.add(
        "imports under -X importtime",
        times["total_ms"],
        "ms",
        note=f"{times['modules']} modules (importtime inflates)",
    )
    plain = tweaks["as is (python -c)"]
    for name in ("os._exit after flushing", "gc disabled", "both"):
        result.add(
            f"  what-if: {name}",
            1000 * tweaks[name],
            "ms",
            note=f"vs {1000 * plain:.0f} ms as is through python -c (interleaved)",
        )
    dev_imported = sorted(set(hidden) & set(times["roots"]))
    for verb in ("run", "status"):
        result.add(
            f"  what-if: {verb}, production packages only",
            1000 * production[verb]["production packages"],
            "ms",
            note=f"vs {1000 * production[verb]['as is']:.0f} ms as is through python -c "
            f"(interleaved); hides what `run` imports of the dev tools: "
            f"{', '.join(dev_imported) or 'nothing'}",
        )
    for name, ms in times["top_packages_ms"][:5]:
        result.add(f"  import {name}", ms, "ms", note="cumulative, -X importtime")
    for label in (FRESH[1][0], FRESH[4][0]):  # the ORM; the HTTP client built with nothing due
        result.add(f"  {label}", alone[label], "ms", note="fresh interpreter")
    if times["not_needed_but_imported"]:
        result.add("  imported but not needed", ", ".join(times["not_needed_but_imported"]))
    return result
