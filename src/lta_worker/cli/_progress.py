"""The progress line `run` shows on a terminal (never elsewhere: piped output stays JSON
lines); log lines written through `ProgressLine` scroll above it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from lta_worker.runtime import Clock
    from lta_worker.worker import PassEngine, ProgressFn

BAR_WIDTH = 24
CLEAR = "\r\033[K"  # back to the line's start, erase to its end


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


class ProgressLine:
    """A terminal stream that keeps one progress line (`show`) below whatever else is written
    to it (`print` writes the text and the newline in two calls: redrawn after the newline)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.line = ""
        self._mid_line = False
        self._lock = threading.Lock()

    def isatty(self) -> bool:
        """True: it only ever wraps a terminal."""
        return True

    def write(self, text: str) -> int:
        """Write `text` above the progress line."""
        with self._lock:
            if self.line and not self._mid_line:
                self.stream.write(CLEAR)
            self.stream.write(text)
            if text:
                self._mid_line = not text.endswith("\n")
            if self.line and not self._mid_line:
                self.stream.write(self.line)
            return len(text)

    def flush(self) -> None:
        """Flush the terminal."""
        self.stream.flush()

    def show(self, line: str) -> None:
        """Draw (or redraw) the progress line."""
        with self._lock:
            self.line = line
            if not self._mid_line:
                self.stream.write(CLEAR + line)
                self.stream.flush()

    def end(self) -> None:
        """End the progress line as it stands, with a newline; later writes start below it."""
        with self._lock:
            if self.line:
                self.stream.write(("\n" if self._mid_line else CLEAR) + self.line + "\n")
                self._mid_line = False
                self.stream.flush()
            self.line = ""


def progress_line(stream: TextIO) -> ProgressLine | None:
    """A `ProgressLine` over `stream` when it is a terminal; None otherwise."""
    return ProgressLine(stream) if stream.isatty() else None


@contextmanager
def progress_for(stream: TextIO | ProgressLine, clock: Clock) -> Iterator[ProgressFn | None]:
    """A progress callback drawing on `stream` when it is a terminal; None otherwise."""
    line = stream if isinstance(stream, ProgressLine) else progress_line(stream)
    if line is None:
        yield None
        return
    start = clock.monotonic()

    def draw(engine: PassEngine) -> None:
        snap = engine.pacer.snapshot()
        left = engine.options.max_duration.total_seconds() - (clock.monotonic() - start)
        line.show(
            render_progress(
                done=engine.result.users,
                due=engine.due_at_start,
                reads=engine.result.reads,
                remaining=snap.remaining,
                time_left=left,
            )
        )

    try:
        yield draw
    finally:
        line.end()
