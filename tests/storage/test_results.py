"""Snapshots and history: opaque payloads, history on change only, idempotent replay, purges."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from lta_worker.domain import PendingEnrollment, SnapshotWrite, UserUpdate, canonical_json
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from lta_worker.storage import _results as results
from support.storage import MINUTE, T0, enroll, keyring

HOUR = timedelta(hours=1)
PAYLOAD = {"zeta": 1, "alpha": [1, 2.5, "é", None, True], "big": 2**62, "nested": {"b": 1, "a": 2}}


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def turn(
    user_id: int, fetched_at: Any, *snaps: tuple[str, str, Any], state: str = "active"
) -> UserUpdate:
    """An update with the given (endpoint, status, payload) snapshots fetched at `fetched_at`."""
    return UserUpdate(
        user_id=user_id,
        state=state,  # type: ignore[arg-type]
        next_due_at=fetched_at + HOUR,
        consecutive_failures=0,
        last_outcome="ok",
        last_polled_at=fetched_at,
        snapshots=tuple(
            SnapshotWrite(endpoint=e, status=s, payload=p, fetched_at=fetched_at)  # type: ignore[arg-type]
            for e, s, p in snaps
        ),
    )


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the user, snapshot and history tables, for before/after comparisons."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.database.read() as conn:
        for table in ("users", "snapshots", "history"):
            rows = conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2")).all()  # noqa: S608
            out[table] = [tuple(r) for r in rows]
    return out


def test_first_read_creates_snapshot_and_history_kept_exactly(store: Store, vault: Vault) -> None:
    """The first result is the snapshot and first history row, payload kept exactly."""
    row = enroll(store, vault, "a")
    store.apply([turn(row.id, T0, ("latest-change", "ok", PAYLOAD), ("stats", "none", None))])
    exported = {r.endpoint: r for r in store.export_results()}
    result = exported["latest-change"]
    assert result.payload == PAYLOAD
    assert list(result.payload) == list(PAYLOAD)  # key order, unicode, big ints and floats
    assert list(result.payload["nested"]) == ["b", "a"]
    assert isinstance(result.payload["big"], int)
    assert result.fetched_at == result.changed_at == T0
    assert (exported["stats"].status, exported["stats"].payload) == ("none", None)
    assert [h.payload for h in store.history("a", "latest-change")] == [PAYLOAD]
    assert store.history("a", "stats")[0].status == "none"


def test_same_content_updates_fetched_at_only(store: Store, vault: Vault) -> None:
    """Reading the same content again moves fetched_at, keeps changed_at, adds no history."""
    row = enroll(store, vault, "a")
    store.apply([turn(row.id, T0, ("stats", "ok", PAYLOAD))])
    store.apply([turn(row.id, T0 + HOUR, ("stats", "ok", dict(reversed(PAYLOAD.items()))))])
    (result,) = store.export_results()
    assert (result.fetched_at, result.changed_at) == (T0 + HOUR, T0)
    assert len(store.history("a", "stats")) == 1


def test_changed_content_appends_history(store: Store, vault: Vault) -> None:
    """A new content updates the snapshot and appends one history row; so does ok -> none."""
    row = enroll(store, vault, "a")
    store.apply([turn(row.id, T0, ("latest-change", "ok", {"v": 1}))])
    store.apply([turn(row.id, T0 + HOUR, ("latest-change", "ok", {"v": 2}))])
    store.apply([turn(row.id, T0 + 2 * HOUR, ("latest-change", "none", None))])
    past = store.history("a", "latest-change")
    assert [(h.status, h.payload, h.fetched_at) for h in past] == [
        ("ok", {"v": 1}, T0),
        ("ok", {"v": 2}, T0 + HOUR),
        ("none", None, T0 + 2 * HOUR),
    ]
    (result,) = store.export_results()
    assert (result.status, result.changed_at) == ("none", T0 + 2 * HOUR)
    assert past[0].content_hash == results.content_hash({"v": 1})


def test_replaying_updates_writes_nothing_new(store: Store, vault: Vault) -> None:
    """Applying the same batch again (after a crash) leaves every table exactly as it was."""
    a = enroll(store, vault, "a")
    b = enroll(store, vault, "b")
    batch = [
        turn(a.id, T0, ("latest-change", "ok", PAYLOAD), ("stats", "ok", {"n": 1})),
        turn(b.id, T0, ("latest-change", "none", None)),
    ]
    store.apply(batch)
    before = dump(store)
    store.apply(batch)
    store.apply(batch[:1])
    assert dump(store) == before


def test_older_write_is_ignored(store: Store, vault: Vault) -> None:
    """A result older than the stored one (a late replay) does not overwrite or add history."""
    row = enroll(store, vault, "a")
    store.apply([turn(row.id, T0 + HOUR, ("stats", "ok", {"v": "new"}))])
    store.apply([turn(row.id, T0, ("stats", "ok", {"v": "old"}))])
    (result,) = store.export_results()
    assert result.payload == {"v": "new"}
    assert len(store.history("a", "stats")) == 1


def test_content_hash_is_of_canonical_json_and_stable() -> None:
    """The content hash is sha256 of canonical JSON, equal to what earlier versions stored."""
    assert results.content_hash({"a": 1, "b": [1, 2]}) == results.content_hash(
        {"b": [1, 2], "a": 1}
    )
    assert results.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert results.content_hash(None) != results.content_hash({})
    payload = {"b": 1, "a": {"é": [1.5, None, "x"]}}
    stored = "9ddb11156cab4fdce2973998052f7fb23fdd5958af16b7b39ee8902dd911ae60"
    assert results.content_hash(payload) == stored
    assert results.content_hash(payload, canonical_json(payload)) == stored


def test_export_in_batches_and_per_user(store: Store, vault: Vault) -> None:
    """Export walks every (user, endpoint) once across batches, or one user's results."""
    for name in ("a", "b", "c"):
        row = enroll(store, vault, name)
        store.apply(
            [turn(row.id, T0, ("latest-change", "ok", {"u": name}), ("stats", "none", None))]
        )
    everything = list(store.export_results(batch=2))
    assert [(r.user, r.endpoint) for r in everything] == [
        (u, e) for u in ("a", "b", "c") for e in ("latest-change", "stats")
    ]
    assert [r.payload for r in store.export_results("b") if r.status == "ok"] == [{"u": "b"}]
    assert list(store.export_results("nobody")) == []


def test_forget_purges_one_users_results(store: Store, vault: Vault) -> None:
    """A drop with `purge` deletes that user's snapshots and history only, and counts the rows."""
    a = enroll(store, vault, "a")
    b = enroll(store, vault, "b")
    store.apply([turn(a.id, T0, ("stats", "ok", {"v": 1}))])
    store.apply([turn(a.id, T0 + HOUR, ("stats", "ok", {"v": 2}))])
    store.apply([turn(b.id, T0, ("stats", "ok", {"v": 1}))])
    assert store.begin_drop("a", T0, purge=True).purged == 3
    assert store.begin_drop("a", T0, purge=True).purged == 0
    assert [r.user for r in store.export_results()] == ["b"]


def _with_results(store: Store, vault: Vault, name: str) -> int:
    row = enroll(store, vault, name)
    store.apply([turn(row.id, T0 - 90 * HOUR * 24, ("stats", "ok", {"u": name}))])
    return row.id


def test_retention_purges_revoked_and_dropped_after_delay(store: Store, vault: Vault) -> None:
    """Results of users revoked/dropped longer ago than the delay go; others stay."""
    days = timedelta(days=1)
    for name in ("revoked-old", "revoked-new", "dropped-old", "active"):
        _with_results(store, vault, name)
    store.delete_token("revoked-old", "revoked", T0 - 31 * days)
    store.delete_token("revoked-new", "revoked", T0 - 29 * days)
    store.delete_token("dropped-old", "dropped", T0 - 30 * days)
    counts = store.purge_expired(T0, timedelta(days=30))
    assert (counts.users, counts.snapshots, counts.history) == (2, 2, 2)
    assert sorted(r.user for r in store.export_results()) == ["active", "revoked-new"]
    assert store.get_user("revoked-old") is not None  # the user row itself stays
    assert store.purge_expired(T0, timedelta(days=30)).users == 0
    assert store.purge_expired(T0, timedelta(0)).users == 1  # 0: revoked-new's go at once
    assert [r.user for r in store.export_results()] == ["active"]


def test_retention_purges_dead_pending_enrollments(store: Store, vault: Vault) -> None:
    """Used and expired pending enrollments are purged; live ones stay."""
    for state, expires in (("used", T0 + HOUR), ("expired", T0 - MINUTE), ("live", T0 + HOUR)):
        store.save_pending(
            state,
            PendingEnrollment(
                user="u",
                verifier=vault.encrypt(Secret("v" * 43), user="u", purpose="verifier"),
                redirect_uri="https://app.example/cb",
                created_at=T0 - HOUR,
                expires_at=expires,
            ),
        )
    assert store.take_pending("used", T0) is not None
    assert store.purge_expired(T0, timedelta(days=30)).pending == 2
    assert store.take_pending("live", T0) is not None
