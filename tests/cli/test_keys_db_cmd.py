"""`lta-worker keys generate|rotate` and `lta-worker db upgrade`, through the real entry point
in-process (a key file refused, a key id lost, a newer schema: tests/reliability/test_cli_errors.py,
tests/storage/test_rotation.py, tests/reliability/test_bad_input.py)."""

from __future__ import annotations

import base64
from pathlib import Path

from lta_worker.storage import HEAD_REVISION, Keyring, Store, Vault, load_key_file
from support.process import run_here
from support.storage import enroll, keyring, token_for

from .test_readonly_cmds import cli, write_config


def key_line(key_id: str, material: bytes) -> str:
    """A key file line as docs/ describe it: `ID:BASE64(32 bytes)`."""
    return f"{key_id}:{base64.b64encode(material).decode('ascii')}"


def write_keys(path: Path, ring_lines: list[str]) -> Path:
    """Write key lines to `path` (mode 0600)."""
    path.write_text("# token keys\n" + "\n".join(ring_lines) + "\n")
    path.chmod(0o600)
    return path


def test_keys_generate_prints_a_key_line(tmp_path: Path) -> None:
    """`keys generate` prints one parseable line; two runs give different ids and keys."""
    first, second = (run_here(["keys", "generate"]) for _ in range(2))
    assert (first.returncode, second.returncode) == (0, 0), first.stderr
    one = load_key_file(write_keys(tmp_path / "one", [first.stdout]))
    two = load_key_file(write_keys(tmp_path / "two", [second.stdout]))
    assert first.stdout.count("\n") == 1
    assert one.current_id.startswith("k") and one.current_id.endswith("Z")
    assert one.current_id != two.current_id
    assert one.keys[one.current_id] != two.keys[two.current_id]


def test_keys_rotate_then_old_key_removed(tmp_path: Path, store_url: str) -> None:
    """`keys rotate` re-encrypts every token; after removing the old line all still decrypt."""
    ring = keyring("k-old", "k-new")
    old = Vault(Keyring({"k-old": ring.keys["k-old"]}))
    tokens = {f"u{n}": token_for(f"u{n}") for n in range(5)}
    with Store.open(store_url) as store:
        for user, token in tokens.items():
            enroll(store, old, user, token=token)
    config = write_config(tmp_path, store_url)
    lines = [key_line(k, m) for k, m in ring.keys.items()]
    keys = write_keys(tmp_path / "keys", lines)
    done = cli(config, "keys", "rotate", "--batch-size", "2")
    assert done.returncode == 0, done.stderr
    assert "5 re-encrypted, 0 already current, 0 failed" in done.stdout
    assert '"event": "keys.rotated"' in done.stderr
    write_keys(keys, lines[1:])
    vault = Vault(load_key_file(keys))
    with Store.open(store_url) as store:
        for user, token in tokens.items():
            row = store.get_user(user)
            assert row is not None and row.token is not None
            assert vault.decrypt(row.token, user=user) == token


def test_db_upgrade(tmp_path: Path, empty_url: str) -> None:
    """`db upgrade` migrates an empty database, then reports it current."""
    config = write_config(tmp_path, empty_url)
    done = cli(config, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert f"upgraded to revision {HEAD_REVISION}" in done.stdout
    done = cli(config, "db", "upgrade")
    assert (done.returncode, done.stdout.strip()) == (
        0,
        f"database schema is current (revision {HEAD_REVISION})",
    )
