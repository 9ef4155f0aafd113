"""Every package's face lists what it exports in `__all__` (once), and exports what it lists."""

from __future__ import annotations
import __future__

import importlib
import types
from pathlib import Path

import pytest

import lta_worker

ROOT = Path(lta_worker.__path__[0])
# Every package under lta_worker but the migrations.
FACES = sorted(
    ".".join(("lta_worker", *path.parent.relative_to(ROOT).parts))
    for path in ROOT.rglob("__init__.py")
    if "migrations" not in path.parts
)


def _public_members(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
    }


@pytest.mark.parametrize("face", FACES)
def test_all_names_exactly_what_the_face_exports(face: str) -> None:
    """`__all__` names each public member of the face once, and nothing it lacks."""
    module = importlib.import_module(face)
    listed = module.__all__
    assert len(listed) == len(set(listed)), f"{face}.__all__ repeats a name"
    assert [name for name in listed if not hasattr(module, name)] == []
    public = _public_members(module)
    assert sorted(public - set(listed)) == [], f"{face} exports names missing from __all__"
