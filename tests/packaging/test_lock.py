"""uv.lock matches pyproject.toml; constraints.txt pins exactly what uv.lock pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
LOCK = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
SELF = canonicalize_name(PYPROJECT["project"]["name"])

Wanted = set[tuple[str, str, str]]  # (name, specifier set as text, extra or "")


def _canonical(name: str, spec: SpecifierSet, extra: str) -> tuple[str, str, str]:
    return canonicalize_name(name), ",".join(sorted(str(s) for s in spec)), extra


def _pyproject_requirements() -> Wanted:
    """Every requirement of the project, self-referencing extras expanded."""
    project = PYPROJECT["project"]
    extras: dict[str, list[Requirement]] = {
        name: [Requirement(r) for r in reqs]
        for name, reqs in project["optional-dependencies"].items()
    }
    wanted = {
        _canonical(r.name, r.specifier, "") for r in map(Requirement, project["dependencies"])
    }
    for extra, reqs in extras.items():
        for req in reqs:
            if canonicalize_name(req.name) == SELF:
                wanted |= {
                    _canonical(inner.name, inner.specifier, extra)
                    for used in req.extras
                    for inner in extras[used]
                }
            else:
                wanted.add(_canonical(req.name, req.specifier, extra))
    return wanted


def _locked_requirements() -> Wanted:
    """The project's requirements as uv.lock recorded them when it was last resolved."""
    (package,) = (p for p in LOCK["package"] if p["name"] == SELF)
    out = set()
    for req in package["metadata"]["requires-dist"]:
        extra = re.fullmatch(r"extra == '([^']*)'", req.get("marker", "extra == ''"))
        assert extra is not None, req
        out.add(_canonical(req["name"], SpecifierSet(req.get("specifier", "")), extra[1]))
    return out


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_lock_was_made_from_this_pyproject() -> None:
    """uv.lock holds exactly pyproject's requirements (re-lock after editing pyproject)."""
    assert _locked_requirements() == _pyproject_requirements()


def test_constraints_pin_what_the_lock_pins() -> None:
    """constraints.txt pins every locked package but the project, at the locked version."""
    locked = {p["name"]: p["version"] for p in LOCK["package"] if p["name"] != SELF}
    assert _pins() == locked


def test_pins_satisfy_pyproject() -> None:
    """Every requirement named in pyproject is pinned, at a version its specifier allows."""
    pins = _pins()
    for name, spec, extra in _pyproject_requirements():
        assert name in pins, (name, extra)
        assert SpecifierSet(spec).contains(pins[name]), (name, spec, pins[name])


def test_no_unbounded_runtime_dependency() -> None:
    """Every run-time and extra requirement has an upper bound (dev tools may float)."""
    project = PYPROJECT["project"]
    runtime = [*project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        if extra != "dev":
            runtime += reqs
    for text in runtime:
        req = Requirement(text)
        assert any(s.operator in {"<", "<=", "==", "~="} for s in req.specifier), text
