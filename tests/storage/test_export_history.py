"""Exports that say the state, the history export, and `retention.history` (every backend)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from lta_worker.cli import main
from lta_worker.storage import Store, Vault
from lta_worker.storage._vault import format_key_line
from support.storage import T0, enroll, keyring

from .test_results import turn

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def three_contents(store: Store, vault: Vault, user: str) -> int:
    """Store three distinct latest-change contents for `user`, a day apart from T0."""
    row = enroll(store, vault, user)
    for day in range(3):
        snap = ("latest-change", "ok", {"n": day})
        store.apply([turn(row.id, T0 + day * DAY, snap)])
    return row.id


def test_export_lines_carry_the_users_state(store: Store, vault: Vault) -> None:
    """Each exported result names its user's state now: revoked and dropped are recognisable."""
    for user in ("kept", "gone", "left"):
        three_contents(store, vault, user)
    store.delete_token("gone", "revoked", T0 + 3 * DAY)
    store.delete_token("left", "dropped", T0 + 3 * DAY)
    assert {r.user: r.state for r in store.export_results()} == {
        "kept": "active",
        "gone": "revoked",
        "left": "dropped",
    }


def test_history_export_in_order_per_user_and_since(store: Store, vault: Vault) -> None:
    """The history export lists every stored content in order; `since` and `user` filter it."""
    three_contents(store, vault, "a")
    three_contents(store, vault, "b")
    everything = list(store.export_history())
    assert [(r.user, r.payload) for r in everything if r.user == "a"] == [
        ("a", {"n": 0}),
        ("a", {"n": 1}),
        ("a", {"n": 2}),
    ]
    assert len(everything) == 6
    recent = list(store.export_history("b", since=T0 + DAY))
    assert [(r.payload, r.fetched_at, r.state) for r in recent] == [
        ({"n": 1}, T0 + DAY, "active"),
        ({"n": 2}, T0 + 2 * DAY, "active"),
    ]


def test_retention_history_prunes_old_contents_keeping_the_newest(
    store: Store, vault: Vault
) -> None:
    """retention.history prunes old contents but the newest per (user, endpoint), snapshot kept."""
    three_contents(store, vault, "a")
    counts = store.purge_expired(T0 + 30 * DAY, after=30 * DAY, history=10 * DAY)
    assert counts.history_pruned == 2
    assert [r.payload for r in store.export_history("a")] == [{"n": 2}]
    assert [r.payload for r in store.export_results("a")] == [{"n": 2}]
    assert store.purge_expired(T0 + 30 * DAY, after=30 * DAY, history=10 * DAY).history_pruned == 0


def test_cli_export_history_and_state(
    store: Store,
    store_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`results export` lines carry `state`; `--history --since` works; `--since` alone exits 2."""
    for name in list(os.environ):
        if name.startswith("LTA_WORKER_"):
            monkeypatch.delenv(name)
    ring = keyring("k1")
    key_file = tmp_path / "keys"
    key_file.write_text(format_key_line("k1", ring.keys["k1"]) + "\n")
    key_file.chmod(0o600)
    three_contents(store, Vault(ring), "alice")
    store.delete_token("alice", "revoked", T0 + 3 * DAY)
    config = tmp_path / "config.toml"
    config.write_text(
        '[service]\nbase_url = "https://api.example"\nauth_url = "https://auth.example"\n'
        f'[client]\nid = "client"\n[database]\nurl = {store_url!r}\n'
        f'[crypto]\nkey_file = {str(key_file)!r}\n[log]\nformat = "json"\n'
    )

    def cli(*args: str) -> tuple[int, list[str]]:
        with pytest.raises(SystemExit) as info:
            main(["--config", str(config), "results", "export", *args])
        out, _ = capsys.readouterr()
        return int(info.value.code or 0), out.splitlines()

    code, lines = cli()
    assert code == 0
    assert [json.loads(line)["state"] for line in lines] == ["revoked"]
    code, lines = cli("--history", "--since", (T0 + DAY).isoformat())
    assert code == 0
    assert [json.loads(line)["payload"] for line in lines] == [{"n": 1}, {"n": 2}]
    assert set(json.loads(lines[0])) >= {"user", "endpoint", "status", "payload", "fetched_at"}
    code, _ = cli("--since", "7d")
    assert code == 2
    code, _ = cli("--history", "--since", "yesterday")
    assert code == 2
