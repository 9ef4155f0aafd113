"""The commands over a database, through the CLI in-process, over SQLite and PostgreSQL. The
read-only ones (`status`, `users list`, `results export`, `check`) never create, migrate or write
the database; a missing database or an old schema is one line naming `lta-worker db upgrade`,
exit 78. Lines an operator reads: `check` tries the listeners' addresses and names the fix for a
secret file it may not read, `run` names a broken secret file before the database's lock. `keys
generate|rotate` and `db upgrade` (a key file refused, a key id lost, a newer schema:
tests/reliability/test_cli_errors.py, tests/storage/test_rotation.py,
tests/reliability/test_bad_input.py)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from lta_worker.errors import LtaError
from lta_worker.storage import HEAD_REVISION, Keyring, Store, Vault, load_key_file
from lta_worker.storage._migrate import alembic_config
from lta_worker.storage._vault import format_key_line
from support.process import Output, render_toml, run_here, write_private
from support.storage import enroll, keyring, token_for

READ_ONLY = [
    ("status",),
    ("status", "--format", "json"),
    ("users", "list"),
    ("users", "list", "--format", "json"),
    ("results", "export"),
    ("results", "export", "--changed-since", "0"),
    ("check",),
]


def write_config(tmp_path: Path, url: str) -> Path:
    """A config for `url`, with a key file and a client secret file (mode 0600)."""
    keys = write_private(tmp_path / "keys", "k1:" + "A" * 43 + "=\n")
    secret = write_private(tmp_path / "secret", "s3cr3t-value\n")
    service = {"base_url": "http://127.0.0.1:9", "auth_url": "http://127.0.0.1:9"}
    config = tmp_path / "config.toml"
    config.write_text(
        render_toml(
            {
                "service": service,
                "client": {"id": "client", "secret_file": str(secret)},
                "database": {"url": url},
                "crypto": {"key_file": str(keys)},
                "log": {"format": "json"},
            }
        )
    )
    return config


def cli(config: Path, *args: str) -> Output:
    """`lta-worker --config CONFIG ARGS` in this process."""
    return run_here(["--config", str(config), *args])


def tables(url: str) -> set[str]:
    """The tables of the database at `url` (opened read-only, so nothing is created)."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            return set()
    with Store.open(url, read_only=True) as store, store.database.read() as conn:
        return set(inspect(conn).get_table_names())


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_missing_database_is_78_naming_db_upgrade(
    tmp_path: Path, empty_url: str, args: tuple[str, ...]
) -> None:
    """A read-only command on no database: 78 naming `db upgrade`, nothing created."""
    done = cli(write_config(tmp_path, empty_url), *args)
    assert done.returncode == 78, done.stderr
    if args[0] == "check":
        assert "lta-worker db upgrade" in done.stdout
    else:
        event = json.loads(done.stderr.splitlines()[-1])
        assert (event["event"], event["exit_code"]) == ("error", 78)
        assert "lta-worker db upgrade" in str(event["hint"])
        if empty_url.startswith("sqlite"):
            assert event["error"] == "NoDatabaseError", event
            assert "does not exist" in str(event["message"])
    if empty_url.startswith("sqlite"):
        assert not Path(empty_url.removeprefix("sqlite:///")).parent.exists()
    assert tables(empty_url) == set()


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_old_schema_is_78_and_stays_old(
    tmp_path: Path, empty_url: str, args: tuple[str, ...]
) -> None:
    """A read-only command on an old schema: 78 naming `db upgrade`; no migration."""
    from alembic import command

    if empty_url.startswith("sqlite"):
        Path(empty_url.removeprefix("sqlite:///")).parent.mkdir(mode=0o700)
    with Store.open(empty_url) as store:
        command.upgrade(alembic_config(store.database), "0002")
    done = cli(write_config(tmp_path, empty_url), *args)
    assert done.returncode == 78, done.stderr
    assert "lta-worker db upgrade" in done.stdout + done.stderr
    with Store.open(empty_url, read_only=True) as store:
        assert store.schema_revision() == "0002"


def test_read_only_commands_write_nothing(tmp_path: Path, store_url: str) -> None:
    """Read-only commands leave a current database byte for byte as it was."""
    with Store.open(store_url) as store:
        enroll(store, Vault(keyring("k1")), "alice")
        with store.database.read() as conn:
            before = conn.execute(text("SELECT * FROM users")).all()
    config = write_config(tmp_path, store_url)
    path = Path(store_url.removeprefix("sqlite:///")) if store_url.startswith("sqlite") else None
    snapshot = path.read_bytes() if path else None
    for args in READ_ONLY[:-1]:
        done = cli(config, *args)
        assert done.returncode == 0, (args, done.stderr)
    if path is not None:
        assert path.read_bytes() == snapshot
        assert sorted(p.name for p in path.parent.iterdir()) == ["lta.db"]
    with Store.open(store_url, read_only=True) as store, store.database.read() as conn:
        assert conn.execute(text("SELECT * FROM users")).all() == before


def test_read_only_store_refuses_writes(store_url: str) -> None:
    """A read-only store cannot write (SQLite mode=ro, PostgreSQL read-only transactions)."""
    with Store.open(store_url, read_only=True) as store:
        with pytest.raises(LtaError) as info:
            enroll(store, Vault(keyring("k1")), "mallory")
        assert "read" in str(info.value).lower()
    with Store.open(store_url, read_only=True) as store:
        assert store.get_user("mallory") is None


def _listening(tmp_path: Path, section: str, port: int) -> str:
    """The config lines that make `serve` listen on `port` for `section`."""
    if section == "metrics":
        return f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    keys = write_private(tmp_path / "link-key", "k" * 44 + "\n")
    public = f"http://127.0.0.1:{port}"
    return (
        f'[enroll]\nlisten = "127.0.0.1:{port}"\npublic_url = "{public}"\n'
        f"link_key_file = {str(keys)!r}\n"
    )


@pytest.mark.parametrize("section", ["metrics", "enroll"])
def test_check_tries_the_listen_address(tmp_path: Path, section: str) -> None:
    """A listen address another process holds fails `check` with 78 naming it; a free one passes."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'lta.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base = config.read_text().replace(
            "[client]\n", f'[client]\nredirect_uri = "http://127.0.0.1:{port}/lta/callback"\n'
        )
        config.write_text(base + _listening(tmp_path, section, port))
        done = cli(config, "check", "--format", "json")
    listen = {c["name"]: c for c in json.loads(done.stdout)["checks"]}[f"{section}_listen"]
    assert (done.returncode, listen["ok"], listen["exit_code"]) == (78, False, 78)
    assert listen["message"].startswith(f"{section}.listen: ")
    assert "another process holds it" in listen["hint"]
    done = cli(config, "check", "--format", "json")  # now free
    assert {c["name"]: c for c in json.loads(done.stdout)["checks"]}[f"{section}_listen"]["ok"]
    with socket.socket() as again:  # and let go at once
        again.bind(("127.0.0.1", port))


def test_run_names_a_broken_secret_file_before_the_lock(tmp_path: Path) -> None:
    """A broken secret file under a held lock: `run` exits 78 naming it, not 75."""
    url = f"sqlite:///{tmp_path / 'lta.db'}"
    config = write_config(tmp_path, url)
    (tmp_path / "secret").chmod(0o644)
    with Store.open(url) as store:
        store.upgrade()
        with store.single_instance_lock():
            done = cli(config, "run")
    event = json.loads(done.stderr.splitlines()[-1])
    assert (done.returncode, event["key"]) == (78, "client.secret_file"), event


def test_check_names_the_fix_for_a_secret_file_it_may_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreadable secret file fails `check` with 78 and a `LoadCredential=` hint."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'lta.db'}")
    secret, real_open = str(tmp_path / "secret"), os.open

    def denied(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == secret:  # as root, no mode makes the file unreadable: say it is
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", denied)
    done = cli(config, "check", "--format", "json")
    failed = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["client_secret"]
    assert (done.returncode, failed["exit_code"]) == (78, 78)
    assert "Permission denied" in failed["message"] and "LoadCredential=" in failed["hint"]


def test_keys_generate_prints_a_key_line(tmp_path: Path) -> None:
    """`keys generate` prints one line a key file takes (fresh ids and keys: test_vault)."""
    done = run_here(["keys", "generate"])
    assert (done.returncode, done.stdout.count("\n")) == (0, 1), done.stderr
    ring = load_key_file(write_private(tmp_path / "keys", done.stdout))
    assert ring.current_id.startswith("k") and ring.current_id.endswith("Z")


def test_keys_rotate_then_old_key_removed(tmp_path: Path, store_url: str) -> None:
    """`keys rotate` re-encrypts every token; after removing the old line all still decrypt."""
    ring = keyring("k-old", "k-new")
    old = Vault(Keyring({"k-old": ring.keys["k-old"]}))
    tokens = {f"u{n}": token_for(f"u{n}") for n in range(5)}
    with Store.open(store_url) as store:
        for user, token in tokens.items():
            enroll(store, old, user, token=token)
    config = write_config(tmp_path, store_url)
    lines = [format_key_line(k, m) + "\n" for k, m in ring.keys.items()]
    keys = write_private(tmp_path / "keys", "".join(lines))
    done = cli(config, "keys", "rotate", "--batch-size", "2")
    assert done.returncode == 0, done.stderr
    assert "5 re-encrypted, 0 already current, 0 failed" in done.stdout
    assert '"event": "keys.rotated"' in done.stderr
    write_private(keys, lines[1])
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
