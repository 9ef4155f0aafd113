"""`lta-worker deploy-files --dest DIR` writes deploy/ out, never silently over an edited copy."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from lta_worker.cli import main
from lta_worker.errors import EX_USAGE

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _deploy_files(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(["deploy-files", *args])
    out, err = capsys.readouterr()
    return int(stop.value.code or 0), out, err


def test_writes_every_deploy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every deploy/ file is written byte for byte with its mode; a second call changes nothing."""
    dest = tmp_path / "share" / "lta-worker"
    code, out, err = _deploy_files(capsys, "--dest", str(dest))
    assert (code, err) == (0, "")
    expected = sorted(p.name for p in DEPLOY.iterdir() if p.is_file())
    assert sorted(p.name for p in dest.iterdir()) == expected
    for name in expected:
        assert (dest / name).read_bytes() == (DEPLOY / name).read_bytes(), name
        mode = stat.S_IMODE((dest / name).stat().st_mode)
        assert mode == (0o755 if name == "lta-worker-admin" else 0o644), name
        assert f"written {dest / name}" in out
    code, out, _ = _deploy_files(capsys, "--dest", str(dest))
    assert code == 0
    assert out.count("unchanged") == len(expected)


def test_refuses_to_overwrite_an_edited_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited file stops the command (exit 2, one line) before any write; --force overwrites."""
    edited = tmp_path / "config.example.toml"
    edited.write_text("# mine\n", encoding="utf-8")
    code, out, err = _deploy_files(capsys, "--dest", str(tmp_path))
    assert code == EX_USAGE
    assert out == ""
    assert len(err.splitlines()) == 1
    assert "config.example.toml" in err
    assert "--force" in err
    assert edited.read_text(encoding="utf-8") == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.example.toml"]

    code, _, _ = _deploy_files(capsys, "--dest", str(tmp_path), "--force")
    assert code == 0
    assert edited.read_bytes() == (DEPLOY / "config.example.toml").read_bytes()


def test_unwritable_destination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A destination that cannot be created gives one line and exit 2, not a traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    code, out, err = _deploy_files(capsys, "--dest", str(blocker / "sub"))
    assert (code, out) == (EX_USAGE, "")
    assert len(err.splitlines()) == 1
    assert "cannot write" in err
