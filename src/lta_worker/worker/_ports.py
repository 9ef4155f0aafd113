"""What the pass engine needs of its collaborators: narrow protocols, so that the engine
depends on the few methods it calls and tests can plug in anything that has them (STYLE 4).

The real ones: `storage.Store`, `storage.Vault`, `upstream.ApiClient`, `pacing.Pacer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from lta_worker.domain import Answer, EncryptedToken, Endpoint, Proof, UserRow, UserUpdate
from lta_worker.secret import Secret


class PassStore(Protocol):
    """The store's part in a pass: claim due users, keep their leases, write decisions."""

    def count_due(self, now: datetime) -> int:
        """Users holding a token with `next_due_at <= now`."""
        ...

    def claim_due(
        self, *, now: datetime, due_before: datetime, limit: int, owner: str, lease_until: datetime
    ) -> Sequence[UserRow]:
        """Lease up to `limit` users due before `due_before`, oldest due first."""
        ...

    def renew_leases(
        self, owner: str, lease_until: datetime, held: set[tuple[int, int]] | None = None
    ) -> int:
        """Extend the leases `owner` holds; `held` receives those it holds after it."""
        ...

    def apply(
        self,
        updates: Sequence[UserUpdate],
        owner: str | None = None,
        *,
        now: datetime | None = None,
        discarded: list[tuple[UserUpdate, str]] | None = None,
    ) -> int:
        """Write decisions, each only while its user's row still has its generation."""
        ...

    def release(self, owner: str) -> int:
        """Drop the leases `owner` holds."""
        ...


class TokenVault(Protocol):
    """Decrypts stored tokens."""

    def decrypt(self, token: EncryptedToken, *, user: str) -> Secret:
        """The token in clear; raises `UnknownKeyError` or `TokenDecryptError`."""
        ...


class Reader(Protocol):
    """What the engine needs of the API client."""

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        """One read with the user's long term token (the client adds its secret); never
        raises for HTTP or network trouble."""
        ...

    async def prove(self, proof: Proof) -> bool | None:
        """Whether the client's credentials (`client`) or the read URLs (`urls`) are right,
        asked without spending the read budget; None when the answer does not say."""
        ...
