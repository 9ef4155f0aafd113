"""`lta-worker --version` and `-V` name the version and the commit (an installed copy's, recorded
at build time: test_install.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lta_worker import __version__
from lta_worker.buildinfo import UNKNOWN, git_commit
from lta_worker.cli import main

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r"lta-worker (?P<version>\S+) \(commit (?P<commit>[0-9a-f]{12}(-dirty)?|unknown)\)"
)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_version_and_checkout_commit(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both flags print one line with the package version and, in a checkout, its HEAD."""
    with pytest.raises(SystemExit) as stop:
        main([flag])
    out = capsys.readouterr().out
    assert stop.value.code in (0, None)
    match = LINE.fullmatch(out.strip())
    assert match is not None, out
    assert match["version"] == __version__
    if shutil.which("git") and (ROOT / ".git").exists():
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert head.startswith(match["commit"].removesuffix("-dirty"))


def test_not_a_checkout_has_no_commit(tmp_path: Path) -> None:
    """A directory that is not a git checkout gives no commit, even inside another repository."""
    inside = ROOT / "src"  # inside the checkout, but not its top: git must not be asked
    assert git_commit(tmp_path) is None
    assert git_commit(inside) is None
    assert UNKNOWN == "unknown"
