"""Builds the real collaborators from `Settings`: HTTP client, API client, store, vault, clock.

Commands and the service call these; tests build the same objects with their own
transport, database and clock instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lta_worker.config import Settings
from lta_worker.worker._clock import SystemClock

# httpx, the API client and enrollment are imported where they are used: `status` and a
# `run` with nothing due open the store through here and never talk to the service.
if TYPE_CHECKING:
    import httpx

    from lta_worker.enrollment import Enrollment, Lifecycle
    from lta_worker.errors import KeyFileError
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient


def open_store(settings: Settings) -> Store:
    """Open the configured database and bring its schema up to date; `result.changed`
    events are queued as `[webhook]` asks (`WebhookSettings.result_events`).

    Raises:
        SchemaTooNewError: the database was migrated by a newer lta-worker (exit 78).
        StorageError: the database cannot be reached (exit 75).
    """
    from lta_worker.storage import Store

    store = Store.open(settings.database.url)
    store.result_events = settings.webhook.result_events
    try:
        store.upgrade()
    except BaseException:
        store.close()
        raise
    return store


def load_vault(settings: Settings, *, store: Store | None = None) -> Vault:
    """The token vault from `crypto.key_file` (KeyFileError, exit 78, when unusable).

    With `store`, a missing key file is explained by what the database holds (see
    `missing_key_file`), so that the advice is to restore it rather than make a new one.
    """
    from lta_worker.errors import KeyFileError
    from lta_worker.storage import Vault

    try:
        return Vault.from_settings(settings)
    except KeyFileError as exc:
        if store is None or exc.reason != "missing":
            raise
        in_use = store.key_ids_in_use(SystemClock().now())
        raise missing_key_file(exc, in_use) from None


def missing_key_file(exc: KeyFileError, in_use: Mapping[str, int]) -> KeyFileError:
    """The error for a key file that does not exist, given the key ids the database's
    tokens (and pending enrollments) are encrypted under: with any, the file must be
    restored, since a new key cannot decrypt them (reason `missing_in_use`); with none, a
    new key file is the cure (reason `missing_empty`)."""
    from lta_worker.errors import KeyFileError

    if not in_use:
        return KeyFileError(
            f"{exc.message.removeprefix(f'{exc.key}: ')}; the database holds no token yet",
            key=exc.key,
            reason="missing_empty",
        )
    ids = ", ".join(repr(key_id) for key_id in sorted(in_use))
    stored = sum(in_use.values())
    return KeyFileError(
        f"{exc.message.removeprefix(f'{exc.key}: ')}; the database holds {stored} secret(s) "
        f"encrypted under key id(s) {ids}",
        key=exc.key,
        reason="missing_in_use",
        hint=f"restore the key file with the lines of key id(s) {ids} (from a backup, or the "
        "unit's credential): a new key cannot decrypt the stored tokens",
    )


@dataclass(frozen=True, slots=True)
class Services:
    """What a command that talks to the service needs, opened from the settings."""

    settings: Settings
    store: Store
    vault: Vault
    api: ApiClient

    def enrollment(self) -> Enrollment:
        """An `Enrollment` over these services and the system clock."""
        from lta_worker.enrollment import Enrollment

        return Enrollment(self.settings, self.store, self.vault, self.api, SystemClock().now)

    def lifecycle(self) -> Lifecycle:
        """A `Lifecycle` (drop, forget) over these services and the system clock."""
        from lta_worker.enrollment import Lifecycle

        return Lifecycle(self.settings, self.store, self.vault, self.api, SystemClock().now)


@asynccontextmanager
async def services(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[Services]:
    """Load the vault, open the store (schema upgraded) and the HTTP client; close them after.

    The vault comes first, so a missing or unsafe key file (exit 78) is reported before the
    database is touched.
    """
    from lta_worker.upstream import ApiClient, http_client

    vault = load_vault(settings)
    store = open_store(settings)
    try:
        async with http_client(settings, transport=transport) as http:
            yield Services(settings, store, vault, ApiClient(http, settings))
    finally:
        store.close()
