"""A missing key file: the advice depends on what the database holds. With tokens stored
under its key ids, restore the file (naming those ids), never make a new one; a new key file
is suggested only for an empty database."""

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


@pytest.mark.parametrize("command", [("run",), ("serve",)], ids=["run", "serve"])
def test_missing_key_file_with_tokens_says_restore_it(
    world: Workspace, command: tuple[str]
) -> None:
    """Tokens stored under the key file's id, the file gone: 78, the error names the key id
    the database needs and says to restore the file, and does not suggest a new key."""
    world.enroll(["ada"])
    with world.store() as store:
        needed = sorted(store.key_ids_in_use(datetime.now(UTC)))
    assert needed
    world.key_file.unlink()
    done = world.here(*command)
    assert done.returncode == 78, done.stderr
    event = _error(done.stderr)
    text = f"{event['message']} {event.get('hint')}"
    assert all(key_id in text for key_id in needed)
    assert "restore" in text
    assert "keys generate" not in text


def test_check_names_the_key_ids_a_missing_key_file_had(world: Workspace) -> None:
    """`check` with the key file gone and tokens stored: the `key_file` check says to
    restore it, naming the key ids, never to generate one."""
    world.enroll(["ada"])
    with world.store() as store:
        needed = sorted(store.key_ids_in_use(datetime.now(UTC)))
    world.key_file.unlink()
    done = world.here("check", "--format", "json")
    assert done.returncode == 78
    key_file = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "key_file")
    text = f"{key_file['message']} {key_file['hint']}"
    assert all(key_id in text for key_id in needed) and "restore" in text
    assert "keys generate" not in text


def test_missing_key_file_with_an_empty_database_suggests_a_new_one(world: Workspace) -> None:
    """No token stored yet (a new installation): the advice is to generate a key file."""
    assert world.here("db", "upgrade").returncode == 0
    world.key_file.unlink()
    done = world.here("run")
    assert done.returncode == 78
    assert "keys generate" in _error(done.stderr)["hint"]
