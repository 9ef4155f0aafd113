"""The composition root: `Runtime`, and the `Clock` injected from the top (so that a pass can
run on virtual time). Secret files are read here only, each registered with the log redactor;
only the API client holds the client secret."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack, ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, cast

from lta_worker.config import Settings, read_client_secret, read_link_keys, read_webhook_secret
from lta_worker.errors import KeyFileError

if TYPE_CHECKING:
    import httpx

    from lta_worker.enrollment import Enrollment, Lifecycle
    from lta_worker.pacing import Pacer
    from lta_worker.secret import Secret
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient, WebhookSender

# The secret files by `check`'s name for them.
READERS: Final[Mapping[str, Callable[[Settings], object]]] = {
    "client_secret": read_client_secret,
    "webhook_secret": read_webhook_secret,
    "enroll_link_key": read_link_keys,
}
# Sections set up at start that a reload does not change (a restart does).
FIXED: Final = ("database", "service", "webhook", "enroll", "metrics")


class Clock(Protocol):
    """What the I/O shells read the time from; tests pass a fake one."""

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for deadlines and pacing."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """`anyio.sleep` (imported here: `status` reads the clock and never sleeps)."""
        import anyio

        await anyio.sleep(seconds)


def instance_ttl(settings: Settings) -> timedelta:
    """How long an instance stays live without a heartbeat: four heartbeats."""
    return 4 * settings.serve.heartbeat


class Runtime:
    """Store, vault, API client, pacer and clock, built from `settings` on first use.

    `with` for what needs no HTTP, `async with` for the rest. `read_only`: the database is
    never written, created nor migrated, only its schema checked; `migrate=False`: written
    but never migrated (`lta_worker.api`). `transport`s replace the network (tests).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        read_only: bool = False,
        migrate: bool = True,
        clock: Clock | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        webhook_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.read_only = read_only
        self._migrate = migrate and not read_only
        self.clock: Clock = clock or SystemClock()
        self._transport = transport
        self._webhook_transport = webhook_transport
        self._stack = ExitStack()
        self._async: AsyncExitStack | None = None
        self._store: Store | None = None
        self._vault: Vault | None = None
        self._secrets: dict[str, Any] = {}
        self._http: httpx.AsyncClient | None = None
        self._api: ApiClient | None = None
        self._pacer: Pacer | None = None
        self.webhooks: WebhookSender | None = None
        self.migrated = False  # opening the store applied a migration
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store; the runtime opens nothing more (what it built stays readable)."""
        self._stack.close()
        self._store = None
        self._closed = True

    async def __aenter__(self) -> Self:
        self._async = AsyncExitStack()
        return self

    async def __aexit__(self, *exc: object) -> None:
        import anyio

        try:
            with anyio.CancelScope(shield=True):
                if self._async is not None:
                    await self._async.aclose()
        finally:
            self._async = self._http = self._api = self.webhooks = None
            self.close()

    def _async_stack(self) -> AsyncExitStack:
        if self._async is None:
            raise RuntimeError("HTTP clients are built inside `async with Runtime(...)` only")
        return self._async

    @property
    def store(self) -> Store:
        """The database: migrated on opening, or with `read_only` or `migrate=False` checked.

        Raises:
            SchemaOutdatedError: not migrating, and no schema or an older one.
            SchemaTooNewError: the database was migrated by a newer lta-worker (exit 78).
            StorageError: the database cannot be reached (exit 75).
        """
        if self._store is None:
            if self._closed:
                raise RuntimeError("the Runtime is closed")
            from lta_worker.storage import Store

            store = Store.open(self.settings.database.url, read_only=self.read_only)
            try:
                if not self.read_only:
                    store.result_events = self.settings.webhook.result_events
                if self._migrate:
                    self.migrated = bool(store.upgrade())
                else:
                    store.check_schema()
            except BaseException:
                store.close()
                raise
            self._stack.callback(store.close)
            self._store = store
        return self._store

    @property
    def vault(self) -> Vault:
        """The token vault from `crypto.key_file` (`read_key_file`)."""
        if self._vault is None:
            self._vault = self.read_key_file(explain=True)
        return self._vault

    def read_key_file(
        self, settings: Settings | None = None, *, explain: bool = False, needs: Iterable[str] = ()
    ) -> Vault:
        """The key file read now, under `settings` (those in force by default).

        Raises:
            KeyFileError: the file is unusable (exit 78); with `explain`, a missing one is
                explained by the key ids in use (`missing_key_file`).
            UnknownKeyError: the file lacks one of the key ids `needs`.
        """
        from lta_worker.storage import Vault

        try:
            vault = Vault.from_settings(settings or self.settings)
        except KeyFileError as exc:
            if not explain or exc.reason != "missing":
                raise
            if self._store is None and not self.read_only:
                raise
            try:
                in_use = self.store.key_ids_in_use(self.clock.now())
            except Exception:
                raise exc from None
            raise missing_key_file(exc, in_use) from None
        vault.require_keys(needs)
        return vault

    def secret(self, name: str) -> Any:
        """The secret file `name` (`READERS`), read on first use, registered with the redactor.

        Raises:
            ConfigError: naming the file's setting, never quoting the content.
        """
        if name not in self._secrets:
            from lta_worker.logs import register_secret

            value = READERS[name](self.settings)
            for item in value if isinstance(value, tuple) else (value,):
                register_secret(item)
            self._secrets[name] = value
        return self._secrets[name]

    def secret_files(self) -> dict[str, Callable[[], object]]:
        """Every secret file `run`/`serve` reads at start, with its reader (`check` runs these)."""
        names = ["client_secret"]
        if self.settings.webhook.url is not None:
            names.append("webhook_secret")
        if self.settings.enroll.listen is not None:
            names.append("enroll_link_key")
        return {name: partial(self.secret, name) for name in names}

    @property
    def http(self) -> httpx.AsyncClient:
        """The HTTP client of the service (inside `async with` only)."""
        if self._http is None:
            from lta_worker.upstream import http_client

            concurrency = self.settings.poll.concurrency
            self._http = http_client(
                self.settings.service, concurrency=concurrency, transport=self._transport
            )
            self._async_stack().push_async_callback(self._http.aclose)
        return self._http

    @property
    def api(self) -> ApiClient:
        """The API client (inside `async with` only); built again after a `reload`."""
        if self._api is None:
            from lta_worker.upstream import ApiClient

            settings = self.settings
            secret = self.secret("client_secret")
            self._api = ApiClient(self.http, settings.service, settings.client, secret)
        return self._api

    @property
    def pacer(self) -> Pacer:
        """The pacer, which outlives passes; shared with the other instances on PostgreSQL."""
        if self._pacer is None:
            from lta_worker.pacing import Pacer, PacerCore, SharedBudget

            rl, service = self.settings.ratelimit, self.settings.service
            core = PacerCore(rl, initial_burst=self.settings.poll.breaker_threshold)
            shared = None
            if self.store.dialect == "postgresql":  # SQLite is single-instance (a file lock)
                shared = SharedBudget(
                    self.store,
                    self.settings.client.id,
                    reserve=rl.reserve,
                    clock=self.clock.now,
                    probe_timeout=service.connect_timeout + service.read_timeout,
                )
            self._pacer = Pacer(
                core,
                clock=self.clock.monotonic,
                sleep=self.clock.sleep,
                wall_clock=self.clock.now,
                shared=shared,
            )
        return self._pacer

    async def start(self) -> None:
        """Load the vault, secret files, webhook sender and pacer now: a problem stops the start."""
        _ = self.vault
        for read in self.secret_files().values():
            read()
        if self.settings.webhook.url is not None:
            from lta_worker.upstream import WebhookSender, webhook_http_client

            webhook = self.settings.webhook
            client = webhook_http_client(webhook, transport=self._webhook_transport)
            hooks = await self._async_stack().enter_async_context(client)
            self.webhooks = WebhookSender(hooks, webhook, self.secret("webhook_secret"))
        _ = self.pacer

    def enrollment(self) -> Enrollment:
        """Enrollment over these parts (the key file loaded first, then the store)."""
        from lta_worker.enrollment import Enrollment

        vault, settings = self.vault, self.settings
        return Enrollment(
            settings.client,
            self.store,
            vault,
            lambda: self.api,
            self.clock.now,
            auth_url=settings.service.auth_url,
        )

    def lifecycle(self) -> Lifecycle:
        """Drops and forgets over these parts (the key file and client secret read first)."""
        from lta_worker.enrollment import Lifecycle

        vault = self.vault
        self.secret("client_secret")
        return Lifecycle(self.settings.poll, self.store, vault, lambda: self.api, self.clock.now)

    def reload(self, settings: Settings, *, key_ids_in_use: Iterable[str] = ()) -> None:
        """Re-read the key file and the client secret and take the new settings (SIGHUP).

        All is loaded before anything is replaced: a broken file, or a key file lacking one
        of `key_ids_in_use`, leaves the runtime as it was. A change to a `FIXED` section is
        reported (`service.reload_partial`), not applied: it needs a restart.
        """
        from lta_worker.logs import get_logger, register_secret

        vault = self.read_key_file(settings, needs=key_ids_in_use)
        client_secret = cast("Secret", READERS["client_secret"](settings))
        changed = [k for k in FIXED if getattr(settings, k) != getattr(self.settings, k)]
        if changed:
            log = get_logger("lta_worker.runner")
            log.warning("service.reload_partial", needs_restart=changed)
            settings = replace(settings, **{k: getattr(self.settings, k) for k in FIXED})
        register_secret(client_secret)
        self._vault, self.settings = vault, settings
        self._secrets["client_secret"] = client_secret
        self._api = None

    def reload_keys(self, *, key_ids_in_use: Iterable[str]) -> None:
        """Re-read the key file alone; a broken or incomplete one leaves the keys in force."""
        self._vault = self.read_key_file(needs=key_ids_in_use)


def missing_key_file(exc: KeyFileError, in_use: Mapping[str, int]) -> KeyFileError:
    """The error for a missing key file given the key ids in use: restore it
    (`missing_in_use`), or, with none, make a new one (`missing_empty`)."""
    missing = exc.message.removeprefix(f"{exc.key}: ")
    if not in_use:
        return KeyFileError(
            f"{missing}; the database holds no token yet", key=exc.key, reason="missing_empty"
        )
    ids = ", ".join(repr(key_id) for key_id in sorted(in_use))
    return KeyFileError(
        f"{missing}; the database holds {sum(in_use.values())} secret(s) "
        f"encrypted under key id(s) {ids}",
        key=exc.key,
        reason="missing_in_use",
        hint=f"restore the key file with the lines of key id(s) {ids} (from a backup, or the "
        "unit's credential): a new key cannot decrypt the stored tokens",
    )
