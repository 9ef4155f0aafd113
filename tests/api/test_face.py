"""`lta_worker.api` is promised: its names and their signatures (methods, fields, keys,
error bases) are the ones checked in to face.txt, so that a change to it is deliberate
(update face.txt, docs/python-api.md and CHANGELOG together)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any, is_typeddict

from lta_worker import api

FACE = Path(__file__).with_name("face.txt")
ROOT = Path(__file__).resolve().parents[2]


def _hint(value: Any) -> str:
    return str(getattr(value, "__forward_arg__", value))


def describe(name: str, obj: Any) -> list[str]:
    """One line per promise of the public name `name`."""
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return [f"{name}({', '.join(base.__name__ for base in obj.__bases__)})"]
    if is_typeddict(obj):
        keys = (f"{key}: {_hint(hint)}" for key, hint in obj.__annotations__.items())
        return [f"{name}: TypedDict {{{', '.join(keys)}}}"]
    if dataclasses.is_dataclass(obj):
        fields = (f"{f.name}: {f.type}" for f in dataclasses.fields(obj))
        return [f"{name}: dataclass ({', '.join(fields)})"]
    if inspect.isclass(obj) and obj.__module__.startswith("lta_worker.api"):
        lines = [f"{name}: class"]
        for attr, member in vars(obj).items():
            if callable(member) and (not attr.startswith("_") or attr in {"__init__"}):
                kind = "async " if inspect.iscoroutinefunction(member) else ""
                lines.append(f"{name}.{attr}: {kind}def {inspect.signature(member)}")
        return lines
    if inspect.isclass(obj):
        return [f"{name}: class"]
    if inspect.isfunction(obj):
        return [f"{name}: def {inspect.signature(obj)}"]
    return [f"{name}: {obj!r}"]


def face() -> str:
    return "".join(
        f"{line}\n" for name in api.__all__ for line in describe(name, getattr(api, name))
    )


def test_the_face_is_the_one_checked_in() -> None:
    """Every public name of lta_worker.api, with its signature, is as face.txt has it."""
    assert face() == FACE.read_text(encoding="utf-8"), (
        "lta_worker.api changed: if on purpose, write face() to tests/api/face.txt and say "
        "so in docs/python-api.md and CHANGELOG"
    )


def test_every_reason_the_doc_lists_is_one_the_code_gives() -> None:
    """Each `reason` in docs/python-api.md's table of errors is a literal of the package."""
    doc = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    table = doc[doc.index("## Errors") : doc.index("## Logs inside")].splitlines()
    rows = [row.rsplit("|", 2)[1] for row in table if row.startswith("| `")]
    listed = {code for cell in rows for code in re.findall(r"`([a-z_]+)`", cell)}
    source = "".join(p.read_text("utf-8") for p in (ROOT / "src" / "lta_worker").rglob("*.py"))
    assert len(listed) > 20
    assert sorted(code for code in listed if f'"{code}"' not in source) == []
