"""B5's populations as data: users, their changes and their true change intensity.

A workload file is JSON Lines: a first line `{"days": D}`, then one user a line,
`{"user": "u1", "class": "heavy", "changes": [h, ...]}`, change times in hours from the
start (0 <= h < 24 x D). A user's line may carry `"intensity"`, its true change rate in
changes per hour: 24 values (one day in UTC, repeated every day) or 24 x D values (hour
by hour). Where it is absent, the oracle takes the user's realised changes by hour of the
day over the run (`hourly_intensity`). Parsing is pure (text in, `Workload` out); a
malformed line raises `WorkloadError` naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOURS_A_DAY = 24
# A year: longer runs would only take B5 hours (the simulation steps every read).
MAX_DAYS = 366


class WorkloadError(ValueError):
    """A workload file that cannot be read; the message names the file's line."""


@dataclass(frozen=True)
class WorkloadUser:
    """One user of a population.

    Attributes:
        user: Its name (unique in the workload).
        cls: Its class, the unit of the per-class figures.
        changes: Change times in hours from the start, sorted.
        intensity: The true change rate in changes per hour (24 or 24 x days values), or
            None when only the realised changes are known.
    """

    user: str
    cls: str
    changes: tuple[float, ...]
    intensity: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Workload:
    """A population over `days` days."""

    days: int
    users: tuple[WorkloadUser, ...]

    @property
    def hours(self) -> int:
        """The run's length in hours."""
        return self.days * HOURS_A_DAY


def hourly_intensity(workload: Workload, user: WorkloadUser) -> list[float]:
    """The user's true change rate hour by hour over the run (24 x days values).

    Args:
        workload: The population (for its length).
        user: One of its users.

    Returns:
        Changes per hour for each hour of the run: the given intensity (one day repeated
        when 24 values are given), else the realised changes by hour of the day over the run.
    """
    hours = workload.hours
    if user.intensity is not None:
        if len(user.intensity) == hours:
            return list(user.intensity)
        return [user.intensity[h % HOURS_A_DAY] for h in range(hours)]
    by_hour = [0.0] * HOURS_A_DAY
    for c in user.changes:
        by_hour[int(c) % HOURS_A_DAY] += 1.0 / workload.days
    return [by_hour[h % HOURS_A_DAY] for h in range(hours)]


def parse(lines: Iterable[str], source: str = "workload") -> Workload:
    """Read a workload from JSON Lines.

    Args:
        lines: The file's lines.
        source: Its name, for the error messages.

    Returns:
        The population.

    Raises:
        WorkloadError: A line is not valid JSON or not of the expected shape; the message
            names `source:line` and what is expected there.
    """
    days: int | None = None
    users: list[WorkloadUser] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{source}:{number}"
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise WorkloadError(f"{where}: expected a JSON object on each line")
        if days is None:
            days = _days(item, where)
            continue
        user = _user(item, days, where)
        if user.user in seen:
            raise WorkloadError(f"{where}: user {user.user!r} appears twice")
        seen.add(user.user)
        users.append(user)
    if days is None:
        raise WorkloadError(f'{source}: empty; the first line must be {{"days": D}}')
    if not users:
        raise WorkloadError(f"{source}: no users after the first line")
    return Workload(days, tuple(users))


def load(path: Path) -> Workload:
    """Read a workload file (see `parse`); an unreadable file is a `WorkloadError` too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read the workload file ({exc})") from None
    return parse(text.splitlines(), str(path))


def dumps(workload: Workload) -> str:
    """The workload as JSON Lines, which `parse` reads back to an equal workload."""
    lines = [json.dumps({"days": workload.days})]
    for u in workload.users:
        item: dict[str, Any] = {"user": u.user, "class": u.cls, "changes": list(u.changes)}
        if u.intensity is not None:
            item["intensity"] = list(u.intensity)
        lines.append(json.dumps(item))
    return "\n".join(lines) + "\n"


def _days(item: dict[str, Any], where: str) -> int:
    days = item.get("days")
    if (
        set(item) != {"days"}
        or not isinstance(days, int)
        or isinstance(days, bool)
        or not 1 <= days <= MAX_DAYS
    ):
        raise WorkloadError(
            f'{where}: the first line must be {{"days": D}}, D a whole number from 1 to {MAX_DAYS}'
        )
    return days


def _user(item: dict[str, Any], days: int, where: str) -> WorkloadUser:
    extra = set(item) - {"user", "class", "changes", "intensity"}
    if extra:
        raise WorkloadError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
    name, cls = item.get("user"), item.get("class")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f'{where}: "user" must be a non-empty string')
    if not isinstance(cls, str) or not cls:
        raise WorkloadError(f'{where}: "class" must be a non-empty string')
    changes = _numbers(item.get("changes"), "changes", where)
    end = days * HOURS_A_DAY
    if any(not 0 <= c < end for c in changes):
        raise WorkloadError(f'{where}: "changes" must lie in [0, {end}) hours ({days} days)')
    intensity = None
    if "intensity" in item:
        intensity = _numbers(item["intensity"], "intensity", where)
        if len(intensity) not in {HOURS_A_DAY, end} or any(x < 0 for x in intensity):
            raise WorkloadError(
                f'{where}: "intensity" must be 24 or {end} (24 x days) rates >= 0, '
                f"got {len(intensity)} values"
            )
    return WorkloadUser(name, cls, tuple(sorted(changes)), intensity)


def _numbers(value: Any, key: str, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(_finite(x) for x in value):
        raise WorkloadError(f'{where}: "{key}" must be a list of numbers')
    return tuple(float(x) for x in value)


def _finite(x: Any) -> bool:
    """A JSON number that is a finite float (an integer too large for one is not)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def classes(users: Sequence[WorkloadUser]) -> list[str]:
    """The classes of a population, in order of first appearance."""
    return list(dict.fromkeys(u.cls for u in users))
