"""docs/operations.md's tables the other doc tests do not read, against the code: `users drop`
case by case, the runbooks' states, each way of running, the common error lines."""

from __future__ import annotations

import functools
import re

import pytest

from lta_worker.cli._users_cmd import _report
from lta_worker.domain import EVENT_TYPES, USER_STATES, drop_verdict
from lta_worker.domain._drop import DROP_START
from lta_worker.enrollment import DropResult
from lta_worker.errors import LtaError
from lta_worker.protocol import REVOKED
from support.docs import ROOT, read
from support.docs import table as _table


def table(header: str) -> list[list[str]]:
    """The rows of operations.md's table whose header line starts with `header`."""
    return _table(read("docs/operations.md"), header)


# --- users drop ---------------------------------------------------------------------------

# verdict of the DELETE's answer -> DropResult.upstream, and the state the drop stores then
# (DropResult's contract; the stores' tests prove the writes)
UPSTREAM = {
    "confirmed": ("ok", "dropped"),
    "retry": ("failed", "dropping"),
    "refused": ("refused", "dropping"),
}
# A row's case, by the start of its first cell: the answers it covers (status, code), or
# what the drop met instead of an answer.
ANSWERS: dict[str, list[tuple[int | None, str | None]] | str] = {
    "the service answers 2xx": [(200, None), (204, None)],
    "401 `PermanentAccessRevoked`": [(401, REVOKED)],
    "the service cannot be reached, or answers 5xx / 404": [
        (None, None),
        (503, None),
        (404, None),
        (429, None),
    ],
    "a plain 401": [(401, None)],
    "the user is `revoked` or already `dropped`": "skipped",
    "the user is `dropping` and a DELETE": "in_flight",
    "the user enrolls again": "overtaken",
    "the user is `dropping`": "again",
}


def _case(cell: str) -> str:
    """The longest start of ANSWERS the cell begins with."""
    starts = [s for s in ANSWERS if cell.startswith(s)]
    assert starts, f"a row of the drop table no case covers: {cell}"
    return max(starts, key=len)


def _exit_and_state(result: DropResult) -> tuple[int, str]:
    try:
        code = _report(result, "dropped")
    except LtaError as exc:
        code = exc.exit_code
    return code, result.state


def _results(case: str) -> list[DropResult]:
    """The DropResults the code makes of that case, for a user `active` before."""
    base = {"user": "x", "status": None, "error": "why", "previous_state": "active"}
    answers = ANSWERS[case]
    if answers == "skipped":
        return [
            DropResult(**{**base, "previous_state": state}, upstream="skipped", state=state)  # type: ignore[arg-type]
            for state, start in DROP_START.items()
            if start == "unchanged"
        ]
    if answers == "in_flight":
        return [DropResult(upstream="in_flight", state="dropping", **base)]  # type: ignore[arg-type]
    if answers == "overtaken":
        return [
            DropResult(upstream=up, state="active", overtaken=True, **base)  # type: ignore[arg-type]
            for up in ("ok", "failed")
        ]
    assert isinstance(answers, list)
    results = []
    for status, _code in answers:
        upstream, state = UPSTREAM[drop_verdict(status, _code)]
        results.append(
            DropResult(
                user="x",
                upstream=upstream,  # type: ignore[arg-type]
                status=status,
                error="why",
                previous_state="active",
                state=state,
            )
        )
    return results


DROP_ROWS = table("| case | the command prints | exit | state after | then |")


@pytest.mark.parametrize("row", DROP_ROWS, ids=[r[0][:40] for r in DROP_ROWS])
def test_drop_table_row_is_what_the_code_does(row: list[str]) -> None:
    """Each drop table row's exit code and state after are what the code makes of its case."""
    case, exit_cell, state_cell = _case(row[0]), row[2], row[3]
    if ANSWERS[case] == "again":  # "as above": a `dropping` user's drop starts over
        assert (exit_cell, state_cell) == ("as above", "as above")
        assert DROP_START["dropping"] == "dropping"
        return
    for result in _results(case):
        code, state = _exit_and_state(result)
        assert exit_cell == str(code), (case, result)
        named = re.match(r"`(\w+)`", state_cell)
        if named:
            assert state == named.group(1), (case, result)
        elif state_cell.startswith("unchanged"):
            assert state == result.previous_state, case
        else:
            assert state_cell.startswith("as that DELETE's answer leaves it"), case


def test_drop_table_covers_every_case() -> None:
    """Every case listed here is a row of the table (a row removed fails here)."""
    assert {_case(row[0]) for row in DROP_ROWS} == set(ANSWERS)


# --- runbooks ------------------------------------------------------------------------------

RUNBOOK = table("| state | means | who acts | what to do |")


def test_runbooks_cover_every_state_that_asks_something() -> None:
    """The runbooks cover every state but active and dropped, and name only real webhook types."""
    states = {m.group(1) for row in RUNBOOK if (m := re.fullmatch(r"`(\w+)`", row[0]))}
    assert states == set(USER_STATES) - {"active", "dropped"}
    assert any(row[0].startswith("scope denied") for row in RUNBOOK)
    named = {t for row in RUNBOOK for t in re.findall(r"`((?:user|result)\.\w+)`", " ".join(row))}
    assert named and named <= set(EVENT_TYPES), named - set(EVENT_TYPES)


# --- ways of running -------------------------------------------------------------------------


def test_each_way_of_running_names_shipped_files() -> None:
    """The service / timer / cron table names files deploy/ ships."""
    rows = table("| mode | files | pick it when |")
    assert [row[0].split(" ")[0] for row in rows] == ["service", "timer", "cron"]
    for row in rows:
        for path in re.findall(r"`(deploy/[\w.-]+)`", row[1]):
            assert (ROOT / path).is_file(), path
    timer = rows[1][1]
    assert "+ `.timer`" in timer and (ROOT / "deploy" / "lta-worker-run.timer").is_file()


# --- the common error lines -------------------------------------------------------------

# Words of the line that come from the database driver or the system, not from lta-worker.
DRIVER = frozenset({
    "database disk image is malformed",  # SQLite
    'database "x" does not exist',  # libpq
    'role "x" does not exist',
    "invalid sslmode value",
    "Connection refused",  # the system
    "too many connections",  # PostgreSQL (53300)
})  # fmt: skip
# What the table writes for a value filled in at run time, and where one piece of the
# program's text ends and another begins.
PLACEHOLDERS = (
    r"; |\.\.\.|'K'|'FILE'|'DIR'|\b0\d{3}\b|\bFIFO\b|\bN\b|\bMIN\b|\bMAX\b|\bV\b| / |\(|\)"
)
SETTING = re.compile(r"^(SECTION\.KEY|[a-z]+\.[a-z_]+): ")


@functools.cache
def _texts() -> list[tuple[list[str], int | None]]:
    """Every string of the package, as literal pieces, with the exit code of its error or None."""
    import ast
    import inspect

    from lta_worker import errors

    classes = {
        name: cls.exit_code
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.LtaError)
    }
    out: list[tuple[list[str], int | None]] = []
    for path in (ROOT / "src" / "lta_worker").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                pieces = [v.value for v in node.values if isinstance(v, ast.Constant)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                pieces = [node.value]
            else:
                continue
            code, up = None, parents.get(node)
            while up is not None and code is None:
                if isinstance(up, ast.ClassDef):
                    code = classes.get(up.name)
                elif isinstance(up, ast.Call):
                    func = up.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    code = classes.get(name)
                up = parents.get(up)
            out.append(([str(p) for p in pieces], code))
    return out


ERROR_LINES = table("| error line names | code | what to do |")


@pytest.mark.parametrize("row", ERROR_LINES, ids=[r[0][:40] for r in ERROR_LINES])
def test_each_common_error_line_is_one_the_code_writes(row: list[str]) -> None:
    """Each common error line is the program's text, given to an error of the row's exit code."""
    texts = _texts()
    codes: set[int] = set()
    for named in re.findall(r"`([^`]+)`", row[0]):
        setting = SETTING.match(named)
        if setting:
            codes.add(78)
        line = named[setting.end() :] if setting else named
        for part in re.split(PLACEHOLDERS, line):
            piece = part.strip(" ;:,'")
            if len(piece) < 6 or piece in DRIVER:
                continue
            found = [code for pieces, code in texts if any(piece in p for p in pieces)]
            assert found, f"no text of the program says {piece!r}"
            codes |= {code for code in found if code is not None}
    assert int(row[1]) in codes, (row[0], codes)
