"""docs/log-events.md lists exactly the events, fields and values the code logs."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import get_args

import pytest

from lta_worker.domain import EXIT_CODES, OUTCOME_KINDS, Trip
from lta_worker.domain._outcomes import ALLOWED_CODES
from lta_worker.enrollment import FAILURE_STAGES, STATE_FAILURES
from lta_worker.protocol import ENDPOINTS
from lta_worker.worker._metrics_http import SERVER_JOBS
from lta_worker.worker._scheduler import JOB_IDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "log-events.md"


def field_cells(text: str) -> dict[str, str]:
    """Each event of the event table, by name, with its fields cell."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`[a-z_.]+`", cells[0]):
            out[cells[0].strip("`")] = cells[3]
    return out


def documented_values(event: str, field: str) -> set[str]:
    """The values the event table lists for `field` of `event`: "`field` (`v1`, `v2`)"."""
    cell = field_cells(DOC.read_text(encoding="utf-8"))[event]
    found = re.search(rf"`{field}` \(", cell)
    assert found, f"{event}: no values listed for {field}"
    # The values are those in the parentheses, not in notes nested in them.
    depth, listed = 1, ""
    for char in cell[found.end() :]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            break
        listed += char if depth == 1 and char != ")" else " "
    return set(re.findall(r"`([^`]+)`", listed))


SRC = Path(__file__).resolve().parents[2] / "src" / "lta_worker"
LEVELS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "msg", "fatal"})
# Helpers that take the event name as an argument and log it: name -> its position.
EVENT_PARAMS = {"_halt": 1}
# Calls that log an event held in a variable: the helpers above, forwarding it.
FORWARDERS = {"_halt"}
# Fields every line has (the doc's introduction), not repeated in the table.
BASE_FIELDS = frozenset({"event", "level", "ts", "logger"})
# structlog's own keywords, rendered under another name (`exception`).
RENDERED = {"exc_info": "exception"}


def _is_level_method(node: ast.expr) -> bool:
    """`log.info`, `getattr(log, level)`, or `(log.info if c else log.debug)`."""
    if isinstance(node, ast.Attribute):
        return node.attr in LEVELS
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "getattr"
    if isinstance(node, ast.IfExp):
        return _is_level_method(node.body) and _is_level_method(node.orelse)
    return False


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def mapping_keys(function: ast.AST) -> set[str]:
    """The string keys of the dict literals in `function` and of its `d["key"] = ...`."""
    keys = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Dict):
            keys |= {k for k in map(_literal, filter(None, node.keys)) if k}
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            keys |= {k for k in [_literal(node.slice)] if k}
    return keys


@dataclass
class Logged:
    """What the code logs under one event name."""

    where: str  # one place that logs it
    fields: set[str] = dataclass_field(default_factory=set)  # the keywords given
    open: bool = False  # some call adds fields from a mapping (`**fields`)


def logged_events() -> dict[str, Logged]:
    """Every event name the worker logs (simulator aside), with its fields, read from the source."""
    found: dict[str, Logged] = {}
    unknown: list[str] = []
    forwarded: dict[str, set[str]] = {}  # helper -> the fields its own log call adds
    through: list[tuple[str, str]] = []  # (event, helper)
    for path in sorted(SRC.rglob("*.py")):
        if "simulator" in path.relative_to(SRC).parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        emitters = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _is_level_method(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        functions = {
            node.name: node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        # The innermost function around each node (ast.walk visits outer functions first).
        owner = {
            id(inner): node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            callee = node.func
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            names: list[str | None] = [_literal(k.value) for k in node.keywords if k.arg == "event"]
            keywords = {RENDERED.get(k.arg, k.arg) for k in node.keywords if k.arg} - BASE_FIELDS
            if _is_level_method(callee) or name in emitters:
                names.append(_literal(node.args[0]) if node.args else None)
                helper = owner.get(id(node))
                if names[-1] is None and helper in FORWARDERS:
                    forwarded[str(helper)] = keywords
                elif names[-1] is None:
                    unknown.append(where)
            elif name in EVENT_PARAMS and len(node.args) > EVENT_PARAMS[name]:
                names.append(_literal(node.args[EVENT_PARAMS[name]]))
                through += [(str(names[-1]), name)]
            if any(k.arg == "event" for k in node.keywords) and id(node) in owner:
                # An event built as a mapping (the CLI's `error`): its function's keys.
                keywords |= mapping_keys(functions[owner[id(node)]]) - BASE_FIELDS
            for event in filter(None, names):
                logged = found.setdefault(event, Logged(where))
                logged.fields |= keywords
                logged.open |= any(k.arg is None for k in node.keywords)
    assert not unknown, f"events logged from a variable, unseen by this test: {unknown}"
    for event, helper in through:
        found[event].fields |= forwarded[helper]
    return found


def documented_events(text: str) -> list[str]:
    """The first column of the event table."""
    return re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)


def test_event_table_lists_exactly_the_events_the_code_logs() -> None:
    """Every event the code logs is in the table, and every event of the table is logged."""
    logged = logged_events()
    documented = documented_events(DOC.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), "an event is listed twice"
    assert set(logged) - set(documented) == set(), "logged, not documented"
    assert set(documented) - set(logged) == set(), "documented, never logged"


def documented_fields(text: str) -> dict[str, set[str]]:
    """Each event's fields: the `names` of its fields cell outside parentheses."""
    out = {}
    for event, cell in field_cells(text).items():
        depth, outside = 0, ""
        for char in cell:
            depth += {"(": 1, ")": -1}.get(char, 0)
            outside += char if depth == 0 and char != ")" else " "
        # "in `serve` also `job`": a command, the context of a field, is not one.
        out[event] = set(re.findall(r"(?<!in )`(\w+)`", outside))
    return out


def test_each_events_fields_are_the_ones_logged() -> None:
    """Each event's row lists exactly the fields the code gives it (open mappings aside)."""
    documented = documented_fields(DOC.read_text(encoding="utf-8"))
    missing, extra = {}, {}
    for event, logged in logged_events().items():
        listed = documented[event]
        if logged.fields - listed:
            missing[event] = sorted(logged.fields - listed)
        if not logged.open and listed - logged.fields:
            extra[event] = sorted(listed - logged.fields)
    assert missing == {}, "logged, not in the row"
    assert extra == {}, "in the row, never logged"


@pytest.mark.parametrize(
    ("event", "field", "values"),
    [
        # No read is made for an undecryptable user: that outcome is pass.finished's only.
        ("poll.read", "outcome", set(OUTCOME_KINDS) - {"undecryptable"}),
        ("poll.read", "endpoint", set(ENDPOINTS)),
        ("pass.finished", "stopped", set(EXIT_CODES)),
        ("pass.breaker_tripped", "cause", set(get_args(Trip))),
        ("enroll.failed", "stage", set(FAILURE_STAGES)),
        ("error", "job", set(JOB_IDS) | set(SERVER_JOBS)),  # serve's and its metrics server's
    ],
)
def test_event_lists_the_values_the_code_has(event: str, field: str, values: set[str]) -> None:
    """A field's listed values are the code's (outcomes, endpoints, stop reasons, causes,
    enrollment stages, serve's jobs); `enroll.failed` names each code of stage `state`."""
    assert documented_values(event, field) == values
    assert set(STATE_FAILURES) <= documented_values("enroll.failed", "error_code")


def test_allowed_codes_are_the_codes_kept() -> None:
    """*Allowed codes* lists exactly the codes a body's error code is kept as."""
    text = DOC.read_text(encoding="utf-8")
    listed = text[text.index("## Allowed codes") :].split("the spec's", 1)[1]
    listed = listed.split("Any other text", 1)[0]
    assert set(re.findall(r"`([^`]+)`", listed)) == set(ALLOWED_CODES)
