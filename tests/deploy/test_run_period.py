"""A shipped timer or cron `run` ends (`--max-duration` + the grace period) within its period."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from lta_worker.config import Settings, parse_duration

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _timer_period() -> timedelta:
    text = (DEPLOY / "lta-worker-run.timer").read_text(encoding="utf-8")
    found = re.search(r"^OnCalendar=\*:0/(\d+)$", text, flags=re.MULTILINE)
    assert found, "the timer's OnCalendar is not *:0/N"
    return timedelta(minutes=int(found.group(1)))


def _run_lines() -> list[tuple[str, str]]:
    """(where, command line) of every shipped or documented periodic `run`."""
    unit = (DEPLOY / "lta-worker-run.service").read_text(encoding="utf-8")
    lines = [("timer unit", line) for line in unit.splitlines() if line.startswith("ExecStart=")]
    for path in (DEPLOY / "cron.example", ROOT / "docs" / "operations.md"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"^\*/\d+ ", line) and " run" in line:
                lines.append((path.name, line))
    return lines


@pytest.mark.parametrize(("where", "line"), _run_lines())
def test_a_periodic_run_ends_within_its_period(where: str, line: str) -> None:
    """The run's `--max-duration` plus the default grace period fits in its period."""
    cron = re.match(r"^\*/(\d+) ", line)
    period = timedelta(minutes=int(cron.group(1))) if cron else _timer_period()
    found = re.search(r" run --max-duration (\S+)", line)
    assert found, f"{where}: `run` without --max-duration: {line}"
    grace = Settings.serve.grace_period  # the default: a class attribute of the frozen dataclass
    assert parse_duration(found.group(1)) + grace < period, where
