"""`check`'s database check fails where `run` could not write the SQLite database: the file
or its directory not writable (judged with os.access, so `check` still writes nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest

from lta_worker.config import build_settings
from lta_worker.errors import ConfigError
from lta_worker.storage import Store
from lta_worker.worker import run_checks

RUN_HINT = (
    "make the SQLite file and its directory writable by the user running lta-worker, "
    "or set database.url"
)


def _database_check(database: Path) -> BaseException | None:
    """The error of `check`'s database check on `database` (None: ok); no network."""
    settings = build_settings(
        {
            "service": {"base_url": "https://api.example", "auth_url": "https://auth.example"},
            "client": {"id": "client"},
            "database": {"url": f"sqlite:///{database}"},
        }
    )
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    results = anyio.run(lambda: run_checks(settings, transport=transport))
    (found,) = [result for result in results if result.name == "database"]
    return found.error


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "lta.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.upgrade()
    return path


def test_writable_database_passes(database: Path) -> None:
    """A migrated SQLite database whose file and directory are writable: the check is ok."""
    assert _database_check(database) is None


@pytest.mark.parametrize(("target", "mode"), [("file", 0o400), ("directory", 0o555)])
def test_database_run_cannot_write_fails_the_check(
    database: Path, monkeypatch: pytest.MonkeyPatch, target: str, mode: int
) -> None:
    """A SQLite file or directory `run` cannot write fails the check (78), with `run`'s hint."""
    denied = database if target == "file" else database.parent
    real_access = os.access

    def access(path: str | os.PathLike[str], amode: int, **kwargs: object) -> bool:
        if Path(path) == denied and amode & os.W_OK:
            return False  # as for a non-root user; root may write whatever the mode
        return real_access(path, amode)

    denied.chmod(mode)
    monkeypatch.setattr(os, "access", access)
    try:
        error = _database_check(database)
    finally:
        denied.chmod(0o700 if target == "directory" else 0o600)
    assert isinstance(error, ConfigError) and error.key == "database.url", error
    assert repr(str(denied)) in str(error)
    assert error.hint == RUN_HINT
