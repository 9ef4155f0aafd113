"""The progress line `run` shows on a terminal: users done of due, reads, budget, time left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from lta_worker.worker.clock import Clock
    from lta_worker.worker.engine import PassEngine, ProgressFn

BAR_WIDTH = 24


def render_progress(
    *, done: int, due: int, reads: int, remaining: int | None, time_left: float
) -> str:
    """One progress line (pure)."""
    total = max(due, done, 1)
    filled = round(BAR_WIDTH * done / total)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    budget = "?" if remaining is None else str(remaining)
    minutes, seconds = divmod(max(0, int(time_left)), 60)
    return (
        f"[{bar}] {done}/{due} users  {reads} reads  budget left {budget}  "
        f"time left {minutes}m{seconds:02d}s"
    )


@contextmanager
def progress_for(stream: TextIO, clock: Clock) -> Iterator[ProgressFn | None]:
    """A progress callback drawing on `stream` when it is a terminal; None otherwise."""
    if not stream.isatty():
        yield None
        return
    start = clock.monotonic()

    def draw(engine: PassEngine) -> None:
        snap = engine.pacer.snapshot()
        left = engine.options.max_duration.total_seconds() - (clock.monotonic() - start)
        line = render_progress(
            done=engine.result.users,
            due=engine.due_at_start,
            reads=engine.result.reads,
            remaining=getattr(snap, "remaining", None),
            time_left=left,
        )
        stream.write("\r\033[K" + line)
        stream.flush()

    try:
        yield draw
    finally:
        stream.write("\r\033[K")
        stream.flush()
