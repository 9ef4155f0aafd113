"""Rate-limit arithmetic, pure (`now` in epoch seconds): fixed windows aligned to the epoch,
counting, and RateLimit headers."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final, Literal, get_args

HeaderFormat = Literal["draft", "combined", "triple", "x", "none"]
HEADER_FORMATS: Final[tuple[HeaderFormat, ...]] = get_args(HeaderFormat)
POLICY_NAME: Final = "default"


@dataclass(frozen=True, slots=True)
class Window:
    """One client's count in the window that starts at `start` (epoch seconds)."""

    start: float
    used: int = 0


@dataclass(frozen=True, slots=True)
class Quota:
    """One answer's budget: `reset` whole seconds (>= 1), `reset_at` epoch s, `window` seconds."""

    limit: int
    remaining: int
    reset: int
    reset_at: int
    window: int


def window_start(now: float, length: int) -> float:
    """Return the start (epoch seconds) of the fixed window of `length` seconds holding `now`."""
    if length < 1:
        raise ValueError("a window lasts at least one second")
    return math.floor(now / length) * length


def roll(window: Window | None, now: float, length: int) -> Window:
    """Return the window in force at `now`: `window` itself, or a fresh one (a clock set back
    too gives one, so the count never leaks between windows)."""
    start = window_start(now, length)
    if window is None or window.start != start:
        return Window(start=start)
    return window


def take(window: Window | None, now: float, limit: int, length: int) -> tuple[Window, bool]:
    """Count one request if the budget allows it: (window to keep, counted); a 429 is not."""
    current = roll(window, now, length)
    if current.used >= limit:
        return current, False
    return replace(current, used=current.used + 1), True


def spend(window: Window | None, now: float, length: int, count: int) -> Window:
    """Count `count` requests made elsewhere (the client's other API traffic), past the limit."""
    if count < 0:
        raise ValueError("count must not be negative")
    current = roll(window, now, length)
    return replace(current, used=current.used + count)


def quota(window: Window | None, now: float, limit: int, length: int) -> Quota:
    """Return the budget figures an answer at `now` reports."""
    current = roll(window, now, length)
    end = current.start + length
    return Quota(
        limit=limit,
        remaining=max(0, limit - current.used),
        reset=max(1, math.ceil(end - now)),
        reset_at=math.ceil(end),
        window=length,
    )


def render(fmt: HeaderFormat, q: Quota) -> list[tuple[str, str]]:
    """Render the RateLimit headers of one answer in `fmt` (docs/simulator.md, "Settings")."""
    if fmt == "draft":
        return [
            ("RateLimit", f'"{POLICY_NAME}";r={q.remaining};t={q.reset}'),
            ("RateLimit-Policy", f'"{POLICY_NAME}";q={q.limit};w={q.window}'),
        ]
    if fmt == "combined":
        return [("RateLimit", f"limit={q.limit}, remaining={q.remaining}, reset={q.reset}")]
    if fmt == "triple":
        return [
            ("RateLimit-Limit", str(q.limit)),
            ("RateLimit-Remaining", str(q.remaining)),
            ("RateLimit-Reset", str(q.reset)),
        ]
    if fmt == "x":
        return [
            ("X-RateLimit-Limit", str(q.limit)),
            ("X-RateLimit-Remaining", str(q.remaining)),
            ("X-RateLimit-Reset", str(q.reset_at)),
        ]
    if fmt == "none":
        return []
    raise ValueError(f"unknown header format {fmt!r}; expected one of {', '.join(HEADER_FORMATS)}")


def retry_after(q: Quota) -> int:
    """Seconds a refused client should wait: until the window ends."""
    return q.reset
