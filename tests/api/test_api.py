"""`LtaApi` opens the worker's database without ever migrating it, names what it cannot
find, and makes links `serve` accepts."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from lta_worker.api import LtaApi, SchemaOutdatedError, UnknownUserError
from support.enroll import write_private

from .test_examples import example_settings

SIM = ("https://api.sim.example", "https://api.sim.example/auth")


def test_opening_never_migrates_an_empty_database(tmp_path: Path) -> None:
    """A database without the schema is SchemaOutdatedError on opening, and stays empty."""
    settings = example_settings(tmp_path, *SIM)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    empty.chmod(0o600)
    settings = replace(settings, database=replace(settings.database, url=f"sqlite:///{empty}"))
    with pytest.raises(SchemaOutdatedError) as info, LtaApi(settings):
        pass
    assert info.value.reason == "schema_outdated"
    with sqlite3.connect(empty) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_a_user_the_database_lacks_is_named(tmp_path: Path) -> None:
    """`user` and `results` about an unknown user raise UnknownUserError naming it."""
    with LtaApi(example_settings(tmp_path, *SIM)) as lta:
        for call in (lta.user, lta.results):
            with pytest.raises(UnknownUserError) as info:
                call("nobody")
            assert info.value.user == "nobody"
        assert list(lta.changes(0).lines) == []


def test_enrollment_link_points_at_serves_start_page(tmp_path: Path) -> None:
    """A link from the API is `enroll.public_url`'s start page with a signed `link`."""
    settings = example_settings(tmp_path, *SIM)
    key = write_private(tmp_path / "link-key", "a" * 44 + "\n")
    enroll = replace(settings.enroll, public_url="https://app.example/lta", link_key_file=key)
    with LtaApi(replace(settings, enroll=enroll)) as lta:
        link = lta.enrollment_link("user-42")
    assert link.startswith("https://app.example/lta/enroll/start?link=")
