"""The driver behind `bench/run`: options, the benchmarks in order, the table and the JSON."""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    b1_breakdown,
    b1_overhead,
    b2_budget,
    b3_pg,
    b3_scale,
    b4_start,
    b5_freshness,
    b6_soak,
    b7_events,
    pg,
)
from bench.b5_workload import WorkloadError, load
from bench.common import ROOT, BenchResult, Size, log, machine, render_table, write_results

# B4 first: a start-up time is the most sensitive to what else the machine is doing.
BENCHMARKS: dict[str, Callable[[Size], BenchResult]] = {
    "B4": b4_start.run,
    "B1": b1_overhead.run,
    "B2": b2_budget.run,
    "B3": b3_scale.run,
    "B3PG": b3_pg.run,
    "B5": b5_freshness.run,
    "B6": b6_soak.run,
    "B7": b7_events.run,
}


OUT_FILES: dict[Size, str] = {
    "full": "results.json",
    "quick": "results-quick.json",
    "smoke": "results-smoke.json",
}


def _git(*args: str) -> str:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip()


def source_state() -> dict[str, Any]:
    """The commit measured, and whether src/ had uncommitted changes."""
    return {
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        "src_dirty": bool(_git("status", "--porcelain", "--", "src")),
    }


def _select(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> dict[str, Callable[[Size], BenchResult]]:
    """The benchmarks to run, in order; a `--workload` file is read now.

    Raises:
        WorkloadError: The workload file is malformed (the message names the line).
    """
    chosen = [b.strip().upper() for b in args.only.split(",") if b.strip()] or list(BENCHMARKS)
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    benchmarks = {name: BENCHMARKS[name] for name in chosen}
    if args.workload is not None:
        if "B5" not in chosen:
            parser.error("--workload is B5's population: add --only B5")
        load(args.workload)
        benchmarks["B5"] = functools.partial(b5_freshness.run, workload_file=args.workload)
    return benchmarks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    sizes.add_argument(
        "--smoke", action="store_true", help="tiny sizes and no targets: does everything run?"
    )
    parser.add_argument("--only", default="", help="comma-separated subset, e.g. B1,B3")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    parser.add_argument(
        "--workload", type=Path, help="B5 on this population (JSON Lines, see bench/README.md)"
    )
    parser.add_argument(
        "--database-url",
        help=f"PostgreSQL server for B3PG and B6 (default: ${pg.URL_ENV}; without either, skipped)",
    )
    return parser


def main(argv: list[str]) -> int:
    """Run the chosen benchmarks; return 0 when each ran (met targets or not), else 1."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:  # a bad workload file is a usage error, found before any benchmark runs
        benchmarks = _select(parser, args)
    except WorkloadError as exc:
        print(f"bench/run: error: {exc}", file=sys.stderr)
        return 2
    if args.database_url:
        os.environ[pg.URL_ENV] = args.database_url
    chosen = list(benchmarks)
    size: Size = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = args.out or ROOT / "bench" / OUT_FILES[size]
    info: dict[str, Any] = {
        "quick": args.quick,
        "size": size,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "source": source_state(),
        "sniffio_installed": b1_breakdown.sniffio_installed(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    m = info["machine"]
    log(f"{size} run of {', '.join(chosen)} on {m['cpu']}")
    results: list[BenchResult] = []
    failed = False
    t0 = time.perf_counter()
    for name in chosen:
        started = time.perf_counter()
        log(f"{name} ...")
        try:
            result = benchmarks[name](size)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            failed = True
            traceback.print_exc()
            result = BenchResult(name, "failed")
            result.add("error", f"{type(exc).__name__}: {exc}"[:200])
        if size == "smoke":  # tiny sizes say nothing about the targets
            for figure in result.figures:
                figure.target, figure.met = "", None
        result.seconds = time.perf_counter() - started
        result.details["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        log(f"{name} done in {result.seconds:.0f} s")
        results.append(result)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results(out, info, results)
    _print_summary(size, info, results, out)
    return 1 if failed else 0


def _print_summary(size: Size, info: dict[str, Any], results: list[BenchResult], out: Path) -> None:
    """The table and the counts of targets met and missed, on stdout."""
    m = info["machine"]
    print(f"lta-worker benchmarks ({size} run, {info['started_at']})")
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['python']}; {m['os']}")
    src = info["source"]
    print(
        f"source: {src['commit']}{' + uncommitted changes in src/' if src['src_dirty'] else ''}; "
        f"load average at start {info['load_average_at_start'][0]}, "
        f"took {info['seconds'] / 60:.1f} min"
    )
    print()
    print(render_table(results))
    print()
    met = sum(1 for r in results for f in r.figures if f.met)
    missed = sum(1 for r in results for f in r.figures if f.met is False)
    print(f"targets: {met} met, {missed} missed")
    print(f"results written to {out}")
