"""Every package's face lists what it exports in `__all__` (once), and exports what it lists."""

from __future__ import annotations
import __future__

import importlib
import types
from pathlib import Path

import pytest

import lta_worker

FACES = [
    "lta_worker",
    "lta_worker.api",
    "lta_worker.cli",
    "lta_worker.config",
    "lta_worker.domain",
    "lta_worker.enrollment",
    "lta_worker.pacing",
    "lta_worker.report",
    "lta_worker.runtime",
    "lta_worker.simulator",
    "lta_worker.storage",
    "lta_worker.upstream",
    "lta_worker.worker",
]


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


def test_every_package_has_a_listed_face() -> None:
    """Each package under lta_worker (but the migrations) is one of the faces checked here."""
    root = Path(lta_worker.__path__[0])
    packages = {
        ".".join(("lta_worker", *path.parent.relative_to(root).parts))
        for path in root.rglob("__init__.py")
        if "migrations" not in path.parts
    }
    assert packages == set(FACES)
