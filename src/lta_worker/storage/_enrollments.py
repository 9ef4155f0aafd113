"""Pending enrollments (by the sha256 of their OAuth state, used once) and spent links
(a used row keyed by the sha256 of `link:NONCE`, key id `LINK_MARK`, kept until expiry).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Final

from sqlalchemy import ColumnElement, and_, delete, insert, or_, select, update

from lta_worker.domain import EncryptedToken, PendingEnrollment
from lta_worker.secret import Secret
from lta_worker.storage._db import Queries, insert_for
from lta_worker.storage._models import PendingEnrollmentRow as Row
from lta_worker.storage._models import User

LINK_MARK: Final = ""


def state_hash(state: str | Secret) -> str:
    """The sha256 (hex) under which a pending enrollment's OAuth state is stored."""
    raw = state.reveal() if isinstance(state, Secret) else state
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class EnrollmentQueries(Queries):
    """Started consents and spent enrollment links."""

    def save_pending(self, state: str | Secret, pending: PendingEnrollment) -> None:
        """Store a started consent under the hash of its OAuth state."""
        with self._db.write() as conn:
            conn.execute(
                insert(Row).values(
                    state_hash=state_hash(state),
                    user=pending.user,
                    verifier_ciphertext=pending.verifier.ciphertext,
                    verifier_key_id=pending.verifier.key_id,
                    redirect_uri=pending.redirect_uri,
                    created_at=pending.created_at,
                    expires_at=pending.expires_at,
                )
            )

    def _take(self, match: ColumnElement[bool], now: datetime) -> PendingEnrollment | None:
        stmt = (  # one UPDATE: one take wins
            update(Row)
            .where(match, Row.used_at.is_(None), Row.expires_at > now)
            .values(used_at=now)
            .returning(Row)
        )
        with self._db.write() as conn:
            row = conn.execute(stmt).first()
        if row is None:
            return None
        return PendingEnrollment(
            user=row.user,
            verifier=EncryptedToken(bytes(row.verifier_ciphertext), row.verifier_key_id),
            redirect_uri=row.redirect_uri,
            created_at=row.created_at,
            expires_at=row.expires_at,
        )

    def take_pending(self, state: str | Secret, now: datetime) -> PendingEnrollment | None:
        """Take the pending enrollment of `state`, once: None if unknown, used or expired."""
        return self._take(Row.state_hash == state_hash(state), now)

    def take_latest_pending(self, user: str, now: datetime) -> PendingEnrollment | None:
        """Take the newest live pending enrollment of `user`, once (a bare code has no state)."""
        newest = (
            select(Row.state_hash)
            .where(Row.user == user, Row.used_at.is_(None), Row.expires_at > now)
            .order_by(Row.created_at.desc())
            .limit(1)
            .scalar_subquery()
        )
        return self._take(Row.state_hash == newest, now)

    def purge_pending(self, now: datetime) -> int:
        """Delete pending enrollments that are used or expired; return how many."""
        spent = or_(Row.used_at.is_not(None), Row.expires_at <= now)
        link_alive = and_(Row.verifier_key_id == LINK_MARK, Row.expires_at > now)
        with self._db.write() as conn:
            return conn.execute(delete(Row).where(spent, ~link_alive)).rowcount

    def spend_link(self, nonce: str, user: str, now: datetime, expires_at: datetime) -> bool:
        """Record the link of `nonce` used (kept until `expires_at`); False when it already was."""
        stmt = insert_for(self._db.dialect, Row).values(
            state_hash=state_hash(f"link:{nonce}"),
            user=user,
            verifier_ciphertext=b"",
            verifier_key_id=LINK_MARK,
            redirect_uri="",
            created_at=now,
            expires_at=expires_at,
            used_at=now,
        )
        with self._db.write() as conn:
            # RETURNING says whether the row went in, on both backends (rowcount did not on PG).
            returning = stmt.on_conflict_do_nothing().returning(Row.state_hash)
            return conn.execute(returning).first() is not None

    def forgotten_since(self, user: str, issued_at: datetime | None) -> bool:
        """Whether `user` was forgotten at or after `issued_at` (None: ever): older links fail."""
        with self._db.read() as conn:
            at = conn.execute(select(User.forgotten_at).where(User.user == user)).scalar()
        return at is not None and (issued_at is None or at >= issued_at)
