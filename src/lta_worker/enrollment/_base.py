"""What the client-side operations on users (enrollment, drop, forget) share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from lta_worker.config import Settings, read_client_secret
from lta_worker.logs import register_secret
from lta_worker.secret import Secret

if TYPE_CHECKING:
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient


class ClientOperation:
    """Holds the collaborators of a user operation and the client secret, read lazily.

    Args:
        settings: the validated settings (the client secret file among them).
        store: users, tokens, pending enrollments and results.
        vault: encrypts and decrypts tokens and verifiers at rest.
        api: the service's HTTP interface, or a function returning it, called when a request
            is first sent (the worker builds its HTTP client only when something is sent).
        clock: returns the current aware UTC datetime (injected: the shell passes the
            system clock, tests a fake one).
        client_secret: the client secret (default: read from `client.secret_file` when
            first needed).
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        vault: Vault,
        api: ApiClient | Callable[[], ApiClient],
        clock: Callable[[], datetime],
        *,
        client_secret: Secret | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._vault = vault
        self._api_source = api
        self._clock = clock
        self._client_secret = client_secret

    @property
    def client_secret(self) -> Secret:
        """The client secret, read from its file on first use and registered for redaction."""
        if self._client_secret is None:
            self._client_secret = read_client_secret(self._settings)
        register_secret(self._client_secret)
        return self._client_secret

    @property
    def _api(self) -> ApiClient:
        """The service's HTTP interface (asked of the given function on first use)."""
        source = self._api_source
        if callable(source):
            source = self._api_source = source()
        return source
