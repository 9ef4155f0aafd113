"""Which source this copy was built from, for `--version`: the `_build_info.py` a wheel or
sdist carries (written by `hatch_build.py`, which loads this module by path), else git, asked
on `--version` only so that no start runs a subprocess."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

UNKNOWN = "unknown"


def git_commit(root: Path) -> str | None:
    """The commit checked out at `root` (12 hex digits, `-dirty` with uncommitted changes).

    None when `root` is not the top of a git checkout or git cannot answer.
    """
    if not (root / ".git").exists():
        # Never ask git elsewhere: it would answer for some enclosing repository.
        return None
    git = ["git", "-C", str(root)]
    try:
        # A fixed argv without a shell; only `--version` and builds get here.
        head = subprocess.run(  # noqa: S603
            [*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(  # noqa: S603
            [*git, "diff", "--quiet", "HEAD", "--"], capture_output=True, check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}-dirty" if dirty else head


def build_commit() -> str:
    """The commit this copy was built from: the build's record, the checkout's, or unknown."""
    try:
        info = importlib.import_module("lta_worker._build_info")
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2]
        if not (checkout / "pyproject.toml").is_file():
            return UNKNOWN
        return git_commit(checkout) or UNKNOWN
    return str(getattr(info, "COMMIT", UNKNOWN))


def version_text() -> str:
    """The line `lta-worker --version` prints: name, version and commit."""
    from lta_worker import __version__

    return f"lta-worker {__version__} (commit {build_commit()})"
