"""The install instructions and the changelog name the version being built."""

from __future__ import annotations

import re
from pathlib import Path

from lta_worker import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_operations_installs_this_versions_wheel() -> None:
    """Every wheel file name in docs/operations.md is this version's (bump them together)."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    wheels = re.findall(r"lta_worker-([^-\s]+)-py3-none-any\.whl", text)
    assert wheels
    assert set(wheels) == {__version__}


def test_changelog_has_this_version() -> None:
    """CHANGELOG.md has a section for this version, Keep a Changelog style, under Unreleased."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert __version__ in headings
