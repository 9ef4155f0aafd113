"""The exit code tables (docs/operations.md) and README's summary list exactly the codes
the code exits with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lta_worker import errors
from lta_worker.domain import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"

# Every code a command other than `run` exits with: the EX_* constants (with `status
# --check` unhealthy, SIGPIPE and an interruption) and a bug (an exception's default code).
COMMAND_CODES = {
    *(v for k, v in vars(errors).items() if k.startswith("EX_")),
    errors.LtaError.exit_code,
}


def table_codes(text: str, heading: str) -> set[int]:
    """The codes in the first column of the table that follows `heading`."""
    start = text.index(heading)
    table = text[text.index("| code |", start) :].split("\n\n", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}


@pytest.mark.parametrize(
    ("heading", "codes"),
    [
        ("`run` (timer, cron):", set(EXIT_CODES.values())),
        ("Every other command, `serve` included:", COMMAND_CODES),
    ],
)
def test_exit_code_table_lists_every_code(heading: str, codes: set[int]) -> None:
    """Each exit code table lists exactly the codes its commands exit with."""
    assert table_codes(OPERATIONS.read_text(encoding="utf-8"), heading) == codes


def test_readme_names_runs_codes() -> None:
    """README's summary of `run`'s exit codes names each code a pass ends with."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    summary = text[text.index("Exit codes of `run`:") :].split("Every other command:", 1)[0]
    assert {int(c) for c in re.findall(r"\*\*(\d+)\*\*", summary)} == set(EXIT_CODES.values())
