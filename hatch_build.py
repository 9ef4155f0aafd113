"""Hatch build hook: record the commit a wheel or sdist is built from.

`lta-worker --version` prints the commit, so an operator can tell which source an installed
copy came from. Building from a git checkout writes `lta_worker/_build_info.py` into the
archive (into `src/lta_worker/` of an sdist, so that a wheel built from that sdist, where
there is no git, still carries it). Nothing is written into the checkout itself, and an
editable install gets no file: there `--version` asks git directly, so it never shows a
stale commit.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TEMPLATE = '''"""Written by hatch_build.py when this copy was built; not part of the repository."""

COMMIT = {commit!r}
'''


def _buildinfo(root: Path) -> ModuleType:
    """lta_worker/buildinfo.py, loaded by path: the package is not importable while building."""
    spec = importlib.util.spec_from_file_location(
        "_lta_buildinfo", root / "src" / "lta_worker" / "buildinfo.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds `_build_info.py` to wheels and sdists built from a git checkout."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Write the commit to a temporary file and include it in the archive."""
        if version == "editable":
            return
        root = Path(self.root)
        commit = _buildinfo(root).git_commit(root)
        if commit is None:
            return  # not a checkout: an sdist's own _build_info.py is already in src/
        self._tmp = tempfile.TemporaryDirectory(prefix="lta-build-info-")
        info = Path(self._tmp.name) / "_build_info.py"
        info.write_text(TEMPLATE.format(commit=commit), encoding="utf-8")
        inside = "lta_worker" if self.target_name == "wheel" else "src/lta_worker"
        build_data["force_include"][str(info)] = f"{inside}/_build_info.py"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the temporary file."""
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
