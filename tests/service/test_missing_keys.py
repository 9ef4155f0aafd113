"""A missing key file: restore it (naming its key ids) while tokens use it; a new one only for
an empty database."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from support.process import Workspace


def _error(stderr: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    assert event["event"] == "error"
    return event


@pytest.mark.parametrize("command", ["run", "serve", "check"])
def test_missing_key_file_with_tokens_says_restore_it(world: Workspace, command: str) -> None:
    """Tokens stored under the key file's id, the file gone: 78, the error (`check`: its
    `key_file` check) names the key ids the database needs and says to restore the file,
    never to generate a new key."""
    world.enroll(["ada"])
    with world.store() as store:
        needed = sorted(store.key_ids_in_use(datetime.now(UTC)))
    assert needed
    world.key_file.unlink()
    done = world.here(*(["check", "--format", "json"] if command == "check" else [command]))
    assert done.returncode == 78, done.stderr
    if command == "check":
        said = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "key_file")
    else:
        said = _error(done.stderr)
    text = f"{said['message']} {said.get('hint')}"
    assert all(key_id in text for key_id in needed)
    assert "restore" in text
    assert "keys generate" not in text


def test_missing_key_file_with_an_empty_database_suggests_a_new_one(world: Workspace) -> None:
    """No token stored yet (a new installation): the advice is to generate a key file."""
    assert world.here("db", "upgrade").returncode == 0
    world.key_file.unlink()
    done = world.here("run")
    assert done.returncode == 78
    assert "keys generate" in _error(done.stderr)["hint"]
