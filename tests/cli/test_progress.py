"""The progress line of `run`: what it says, drawn only on a terminal, and log lines that
scroll above it instead of overwriting it."""

from __future__ import annotations

import io
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from lta_worker.cli._progress import (
    BAR_WIDTH,
    CLEAR,
    ProgressLine,
    progress_for,
    progress_line,
    render_progress,
)


class Terminal(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class FixedClock:
    def now(self) -> Any:
        raise AssertionError("the progress line reads monotonic time only")

    def monotonic(self) -> float:
        return 100.0


def screen(raw: str) -> list[str]:
    """What a terminal shows after `raw`: handles \\r, erase-to-end (ESC [K) and \\n."""
    lines, col = [""], 0
    i = 0
    while i < len(raw):
        if raw.startswith("\033[K", i):
            lines[-1] = lines[-1][:col]
            i += 3
            continue
        char = raw[i]
        if char == "\r":
            col = 0
        elif char == "\n":
            lines.append("")
            col = 0
        else:
            current = lines[-1]
            lines[-1] = current[:col] + char + current[col + 1 :]
            col += 1
        i += 1
    return lines


def engine(users: int, due: int, reads: int, remaining: int | None) -> Any:
    """The few engine attributes the progress callback reads."""
    return SimpleNamespace(
        pacer=SimpleNamespace(snapshot=lambda: SimpleNamespace(remaining=remaining)),
        options=SimpleNamespace(max_duration=timedelta(minutes=50)),
        result=SimpleNamespace(users=users, reads=reads),
        due_at_start=due,
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"done": 5, "due": 20, "reads": 9, "remaining": 7, "time_left": 125.9},
            "[######------------------] 5/20 users  9 reads  budget left 7  time left 2m05s",
        ),
        (
            {"done": 0, "due": 3, "reads": 0, "remaining": None, "time_left": 3000},
            f"[{'-' * BAR_WIDTH}] 0/3 users  0 reads  budget left ?  time left 50m00s",
        ),
        (
            {"done": 4, "due": 4, "reads": 8, "remaining": 0, "time_left": -3},
            f"[{'#' * BAR_WIDTH}] 4/4 users  8 reads  budget left 0  time left 0m00s",
        ),
        (
            {"done": 0, "due": 0, "reads": 0, "remaining": 120, "time_left": 59},
            f"[{'-' * BAR_WIDTH}] 0/0 users  0 reads  budget left 120  time left 0m59s",
        ),
    ],
)
def test_render_progress(kwargs: dict[str, Any], expected: str) -> None:
    """The progress line: bar and count, reads, budget left ('?' at first), time left."""
    assert render_progress(**kwargs) == expected


def test_no_progress_line_when_the_stream_is_not_a_terminal() -> None:
    """Piped or journald stderr: no callback, and nothing written."""
    stream = io.StringIO()
    assert progress_line(stream) is None
    with progress_for(stream, FixedClock()) as on_progress:
        assert on_progress is None
    assert stream.getvalue() == ""


def test_on_a_terminal_the_line_is_drawn_then_ended() -> None:
    """On a terminal the line is redrawn in place, then ended with a newline, figures kept."""
    term = Terminal()
    final = render_progress(done=2, due=4, reads=4, remaining=8, time_left=3000)
    with progress_for(term, FixedClock()) as on_progress:
        assert on_progress is not None
        on_progress(engine(users=1, due=4, reads=2, remaining=9))
        on_progress(engine(users=2, due=4, reads=4, remaining=8))
        assert screen(term.getvalue()) == [final]
    assert term.getvalue().startswith(CLEAR)
    assert term.getvalue().endswith("\n")
    assert screen(term.getvalue()) == [final, ""]


def test_log_lines_scroll_above_the_progress_line() -> None:
    """Log lines end up whole above the progress line, which stays last until `end`; later
    lines go below the ended line, which is not drawn again."""
    term = Terminal()
    line = ProgressLine(term)
    assert line.isatty()
    print("first event", file=line, flush=True)
    line.show("[bar 1]")
    print("second event", file=line, flush=True)
    print("third event", file=line, flush=True)
    line.show("[bar 2]")
    assert screen(term.getvalue()) == ["first event", "second event", "third event", "[bar 2]"]
    line.end()
    print("error line", file=line, flush=True)
    assert screen(term.getvalue())[-3:] == ["[bar 2]", "error line", ""]
