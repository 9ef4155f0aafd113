"""What the client-side operations on users (enrollment, drop, forget) share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient


class ClientOperation:
    """Holds the collaborators of a user operation.

    `api` may be a function returning the client for every request (the runtime builds its
    HTTP client lazily, and a new one on SIGHUP); `clock` returns an aware UTC datetime.
    """

    def __init__(
        self,
        store: Store,
        vault: Vault,
        api: ApiClient | Callable[[], ApiClient],
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._vault = vault
        self._api_source = api
        self._clock = clock

    @property
    def _api(self) -> ApiClient:
        source = self._api_source
        return source() if callable(source) else source
