"""Strict JSON at rest: the store refuses NaN and infinities, and `results export` prints only
valid JSON lines, even over a row an older version stored with `Infinity`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from lta_worker.cli import main
from lta_worker.domain import SnapshotWrite, UserUpdate
from lta_worker.storage import OutboxEvent, Store, Vault
from support.storage import T0, enroll, keyring


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def turn(user_id: int, payload: Any) -> UserUpdate:
    return UserUpdate(
        user_id=user_id,
        state="active",
        next_due_at=T0,
        consecutive_failures=0,
        last_outcome="ok",
        last_polled_at=T0,
        snapshots=(SnapshotWrite("latest-change", "ok", payload, T0),),
    )


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_the_store_refuses_a_payload_that_is_not_strict_json(
    store: Store, vault: Vault, value: float
) -> None:
    """A non-finite number fails that user's write (discarded); its batch-mate is written."""
    bad, good = enroll(store, vault, "a"), enroll(store, vault, "b")
    discarded: list[tuple[UserUpdate, str]] = []
    applied = store.apply(
        [turn(bad.id, {"n": value}), turn(good.id, {"n": 1})], discarded=discarded
    )
    assert applied == 1
    assert [(update.user_id, why) for update, why in discarded] == [(bad.id, "failed")]
    assert [(r.user, r.payload) for r in store.export_results()] == [("b", {"n": 1})]
    with store.database.read() as conn:  # the failed write's result.changed rolled back too
        changed = select(OutboxEvent.user).where(OutboxEvent.type == "result.changed")
        assert conn.execute(changed).scalars().all() == ["b"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LTA_WORKER_") or name in {"CREDENTIALS_DIRECTORY", "STATE_DIRECTORY"}:
            monkeypatch.delenv(name)


def test_export_leaves_out_a_legacy_row_that_is_not_strict_json(
    tmp_path: Path, vault: Vault, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stored `Infinity` (older versions) is left out with a warning; every line is JSON."""
    url = f"sqlite:///{tmp_path / 'lta.db'}"
    with Store.open(url) as store:
        store.upgrade()
        bad = enroll(store, vault, "bad")
        good = enroll(store, vault, "good")
        store.apply([turn(bad.id, {"n": 1}), turn(good.id, {"n": 2})])
        with store.database.write() as conn:
            conn.execute(
                text("UPDATE snapshots SET payload = '{\"n\": Infinity}' WHERE user_id = :u"),
                {"u": bad.id},
            )
    config = tmp_path / "config.toml"
    config.write_text(
        '[service]\nbase_url = "https://api.example"\nauth_url = "https://auth.example"\n'
        f'[client]\nid = "client"\n[database]\nurl = {url!r}\n[log]\nformat = "json"\n'
    )
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "results", "export"])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None)
    lines = out.splitlines()
    assert [json.loads(line, parse_constant=_refuse)["user"] for line in lines] == ["good"]
    skipped = [json.loads(line) for line in err.splitlines() if "results.skipped" in line]
    assert [(e["user"], e["endpoint"]) for e in skipped] == [("bad", "latest-change")]


def _refuse(constant: str) -> Any:
    raise AssertionError(f"{constant} is not JSON")
