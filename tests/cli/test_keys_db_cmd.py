"""`lta-worker keys generate|rotate` and `lta-worker db upgrade`, through the real entry point."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from sqlalchemy import text

from lta_worker.storage import HEAD_REVISION, Keyring, Store, Vault, load_key_file
from support.process import run_here
from support.storage import enroll, keyring, token_for


def run(*args: str) -> tuple[int, str, str]:
    """Run `lta-worker ARGS` in-process; return (exit code, stdout, stderr)."""
    done = run_here(list(args))
    return done.returncode or 0, done.stdout, done.stderr


def write_config(tmp_path: Path, url: str, key_file: Path) -> Path:
    """A minimal config file pointing at `url` and `key_file`."""
    config = tmp_path / "config.toml"
    config.write_text(
        "[service]\n"
        'base_url = "https://api.example"\n'
        'auth_url = "https://auth.example"\n'
        "[client]\n"
        'id = "client"\n'
        "[database]\n"
        f"url = {url!r}\n"
        "[crypto]\n"
        f"key_file = {str(key_file)!r}\n"
        "[log]\n"
        'format = "json"\n'
    )
    return config


def key_line(key_id: str, material: bytes) -> str:
    """A key file line as docs/ describe it: `ID:BASE64(32 bytes)`."""
    return f"{key_id}:{base64.b64encode(material).decode('ascii')}"


def write_keys(path: Path, ring_lines: list[str], mode: int = 0o600) -> Path:
    """Write key lines to `path` with `mode`."""
    path.write_text("# token keys\n" + "\n".join(ring_lines) + "\n")
    path.chmod(mode)
    return path


def test_keys_generate_prints_a_key_line(tmp_path: Path) -> None:
    """`keys generate` prints one parseable line; two runs give different ids and keys."""
    code, first, _ = run("keys", "generate")
    assert code == 0
    _, second, _ = run("keys", "generate")
    one = load_key_file(write_keys(tmp_path / "one", [first]))
    two = load_key_file(write_keys(tmp_path / "two", [second]))
    assert first.count("\n") == 1
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
    lines = [key_line(k, m) for k, m in ring.keys.items()]
    keys = write_keys(tmp_path / "keys", lines)
    config = write_config(tmp_path, store_url, keys)
    code, out, err = run("--config", str(config), "keys", "rotate", "--batch-size", "2")
    assert code == 0, err
    assert "5 re-encrypted, 0 already current, 0 failed" in out
    assert '"event": "keys.rotated"' in err
    write_keys(keys, lines[1:])
    vault = Vault(load_key_file(keys))
    with Store.open(store_url) as store:
        for user, token in tokens.items():
            row = store.get_user(user)
            assert row is not None and row.token is not None
            assert vault.decrypt(row.token, user=user) == token


def test_keys_rotate_unknown_key_exits_78_and_changes_nothing(
    tmp_path: Path, store_url: str
) -> None:
    """A stored token under a key id not in the file: exit 78 naming it, nothing modified."""
    with Store.open(store_url) as store:
        enroll(store, Vault(keyring("k-lost")), "alice")
        with store.database.read() as conn:
            before = conn.execute(text("SELECT * FROM users")).all()
    ring = keyring("k-other")
    keys = write_keys(tmp_path / "keys", [key_line(k, m) for k, m in ring.keys.items()])
    code, _, err = run("--config", str(write_config(tmp_path, store_url, keys)), "keys", "rotate")
    assert code == 78
    assert "'k-lost'" in err
    with Store.open(store_url) as store, store.database.read() as conn:
        assert conn.execute(text("SELECT * FROM users")).all() == before


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "does not exist"),
        ("world-readable", "chmod 600"),
        ("malformed", "line 2"),
    ],
)
def test_keys_rotate_bad_key_file_exits_78(
    tmp_path: Path,
    store_url: str,
    setup: str,
    expected: str,
) -> None:
    """A missing, world-readable or malformed key file is exit 78 naming crypto.key_file."""
    keys = tmp_path / "keys"
    if setup == "world-readable":
        write_keys(keys, [key_line("k1", bytes(32))], mode=0o644)
    elif setup == "malformed":
        write_keys(keys, ["k1:short"])
    code, _, err = run("--config", str(write_config(tmp_path, store_url, keys)), "keys", "rotate")
    assert code == 78
    assert "crypto.key_file" in err
    assert expected in err


def test_db_upgrade(tmp_path: Path, empty_url: str) -> None:
    """`db upgrade` migrates an empty database, then reports it current."""
    config = str(write_config(tmp_path, empty_url, tmp_path / "no-keys-needed"))
    code, out, err = run("--config", config, "db", "upgrade")
    assert code == 0, err
    assert f"upgraded to revision {HEAD_REVISION}" in out
    code, out, _ = run("--config", config, "db", "upgrade")
    assert (code, out.strip()) == (0, f"database schema is current (revision {HEAD_REVISION})")


def test_db_upgrade_refuses_newer_schema(tmp_path: Path, store_url: str) -> None:
    """`db upgrade` on a database from a newer lta-worker exits 78 and says so."""
    with Store.open(store_url) as store, store.database.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    config = str(write_config(tmp_path, store_url, tmp_path / "keys"))
    code, _, err = run("--config", config, "db", "upgrade")
    assert code == 78
    assert "newer than this lta-worker knows" in err
