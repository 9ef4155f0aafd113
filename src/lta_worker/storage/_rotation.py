"""`keys rotate`: re-encrypt every token and live verifier under the newest key, in batches
with a compare-and-swap per row (interruptible, rerunnable), key ids checked first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import ColumnElement, func, select, update

from lta_worker.domain import EncryptedToken, RotationReport
from lta_worker.storage._db import Queries
from lta_worker.storage._models import PendingEnrollmentRow as Pending
from lta_worker.storage._models import User
from lta_worker.storage._vault import Purpose, TokenDecryptError

if TYPE_CHECKING:
    from lta_worker.storage._store import Store
    from lta_worker.storage._vault import Vault

DEFAULT_BATCH: Final = 200


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """One stored ciphertext to rotate: a user's token (row = users.id) or a verifier."""

    kind: Purpose
    row: int | str
    user: str
    secret: EncryptedToken


# Where each kind of secret is stored: its table, and the columns of its row key, user,
# ciphertext and key id.
_STORED: Final[dict[Purpose, tuple[Any, ...]]] = {
    "token": (User, User.id, User.user, User.token_ciphertext, User.token_key_id),
    "verifier": (
        Pending,
        Pending.state_hash,
        Pending.user,
        Pending.verifier_ciphertext,
        Pending.verifier_key_id,
    ),
}


def _live(kind: Purpose, now: datetime) -> tuple[ColumnElement[bool], ...]:
    """The rows that hold a secret of `kind` to keep: a token, or a verifier still usable."""
    if kind == "token":
        return (User.token_key_id.is_not(None),)
    return (Pending.used_at.is_(None), Pending.expires_at > now)


class RotationQueries(Queries):
    """The stored ciphertexts, for `rotate_keys`."""

    def key_ids_in_use(self, now: datetime) -> dict[str, int]:
        """How many stored tokens and live verifiers use each key id."""
        counts: dict[str, int] = {}
        with self._db.read() as conn:
            for kind, (*_, key_id) in _STORED.items():
                query = select(key_id, func.count()).where(*_live(kind, now)).group_by(key_id)
                for found, count in conn.execute(query):
                    counts[found] = counts.get(found, 0) + count
        return counts

    def one_secret_per_key_id(self, now: datetime) -> list[StoredSecret]:
        """One stored token and one live verifier under each key id in use (for `check`)."""
        found: list[StoredSecret] = []
        with self._db.read() as conn:
            for kind, (_, row, user, ciphertext, key_id) in _STORED.items():
                ids = select(key_id).where(*_live(kind, now)).distinct()
                for (key,) in conn.execute(ids).all():
                    first = select(row, user, ciphertext).where(*_live(kind, now), key_id == key)
                    # None: dropped or rotated since (PostgreSQL reads each statement afresh)
                    if hit := conn.execute(first.order_by(row).limit(1)).first():
                        secret = EncryptedToken(bytes(hit[2]), key)
                        found.append(StoredSecret(kind, hit[0], hit[1], secret))
        return found

    def secrets_for_rotation(
        self,
        kind: Purpose,
        *,
        exclude_key_id: str,
        now: datetime,
        after: int | str | None = None,
        limit: int = DEFAULT_BATCH,
    ) -> list[StoredSecret]:
        """The next `limit` secrets of `kind` not under `exclude_key_id`, in row order."""
        _, row, user, ciphertext, key_id = _STORED[kind]
        query = (
            select(row, user, ciphertext, key_id)
            .where(*_live(kind, now), key_id != exclude_key_id)
            .order_by(row)
            .limit(limit)
        )
        if after is not None:
            query = query.where(row > after)
        with self._db.read() as conn:
            return [
                StoredSecret(kind, found, name, EncryptedToken(bytes(secret), key))
                for found, name, secret, key in conn.execute(query)
            ]

    def reencrypt(self, swaps: Sequence[tuple[StoredSecret, EncryptedToken]]) -> int:
        """Write each new ciphertext where the row still holds the old one; return how many."""
        done = 0
        with self._db.write() as conn:
            for old, new in swaps:
                table, row, _, ciphertext, key_id = _STORED[old.kind]
                stmt = (
                    update(table)
                    .where(
                        row == old.row,
                        key_id == old.secret.key_id,
                        ciphertext == old.secret.ciphertext,
                    )
                    .values({ciphertext: new.ciphertext, key_id: new.key_id})
                )
                done += conn.execute(stmt).rowcount
        return done


def rotate_keys(
    store: Store, vault: Vault, now: datetime, *, batch: int = DEFAULT_BATCH
) -> RotationReport:
    """Re-encrypt every token and live verifier under `vault.current_key_id`; UnknownKeyError
    before anything is modified when a stored key id is missing from the key file."""
    current = vault.current_key_id
    in_use = store.key_ids_in_use(now)
    vault.require_keys(in_use)
    already = in_use.get(current, 0)
    rotated = failed = 0
    kinds: tuple[Purpose, ...] = ("token", "verifier")
    for kind in kinds:
        after: int | str | None = None
        while True:
            items = store.secrets_for_rotation(
                kind, exclude_key_id=current, now=now, after=after, limit=batch
            )
            if not items:
                break
            swaps: list[tuple[StoredSecret, EncryptedToken]] = []
            for item in items:
                try:
                    swaps.append((item, vault.reencrypt(item.secret, user=item.user, purpose=kind)))
                except TokenDecryptError:
                    failed += 1
            rotated += store.reencrypt(swaps)
            after = items[-1].row
    return RotationReport(key_id=current, rotated=rotated, already_current=already, failed=failed)
