"""The runtime: the long-lived collaborators of passes, built from settings, and the pass.

`Worker` opens the store (migrating it), takes the single-instance lock on SQLite, loads
the key file and the client secret, builds the HTTP client, API client and pacer, and
registers the instance; it closes everything on exit. It is the runtime the pass (`_run`)
and the jobs (`_jobs`) take. Tests build it with the simulator's transport and their own
clock.
"""

from __future__ import annotations

import os
import random
import secrets
import socket
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from lta_worker.config import Settings, read_client_secret, read_webhook_secret
from lta_worker.errors import LtaError
from lta_worker.logs import get_logger, register_secret
from lta_worker.pacing import Pacer, PacerCore, SharedBudget
from lta_worker.worker._clock import Clock, SystemClock
from lta_worker.worker._pass import PassResult, ProgressFn
from lta_worker.worker._plan import PlanCache
from lta_worker.worker._run import run_pass
from lta_worker.worker._wiring import load_vault, open_store

if TYPE_CHECKING:
    import httpx

    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient, WebhookSender
    from lta_worker.worker._engine import PassEngine
    from lta_worker.worker._metrics import Metrics

log = get_logger("lta_worker.runner")


def _log_lease_expired(owner: str, users: int) -> None:
    log.warning("instance.lease_expired", instance=owner, users=users)


T = TypeVar("T")


def _opened(value: T | None) -> T:
    """A collaborator that exists only while the worker is open."""
    if value is None:
        raise RuntimeError("the Worker is used outside `async with Worker(...)`")
    return value


def new_instance_id() -> str:
    """A readable, unique instance id: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


class Worker:
    """Everything a pass needs, opened once; `async with Worker(settings) as w: ...`."""

    def __init__(
        self,
        settings: Settings,
        *,
        kind: str = "run",
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        webhook_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        if metrics is None and (settings.metrics.listen or settings.metrics.textfile):
            from lta_worker.worker._metrics import Metrics

            metrics = Metrics()
        self.metrics = metrics
        self.webhook_transport = webhook_transport
        self.webhooks: WebhookSender | None = None
        self.kind = kind
        self.transport = transport
        self.clock: Clock = clock or SystemClock()
        self.rng = rng
        self.instance = new_instance_id()
        self._stack = AsyncExitStack()
        self._store: Store | None = None
        self._vault: Vault | None = None
        self._api: ApiClient | None = None
        self._open: AsyncExitStack | None = None  # the stack, while the worker is open
        self._pacer: Pacer | None = None
        self.current: PassEngine | None = None  # the engine of the pass in progress
        self.stop_grace: float | None = None  # set by `request_stop`
        self.plans = PlanCache()  # the freshness plan, renewed every few minutes
        self.key_file_problem: str | None = None  # `watch_key_file`'s last finding

    @property
    def store(self) -> Store:
        """The open store (inside `async with` only)."""
        return _opened(self._store)

    @property
    def vault(self) -> Vault:
        """The token vault (inside `async with` only)."""
        return _opened(self._vault)

    @property
    def api(self) -> ApiClient:
        """The service's API client (inside `async with` only), built on first use.

        A pass with nobody due and no drop to retry sends nothing, and never builds it:
        httpx, httpcore and a TLS context with the CA bundle cost a `run` from cron about
        0.15 s of its start.
        """
        if self._api is None:
            stack = _opened(self._open)
            from lta_worker.upstream import ApiClient, http_client

            http = http_client(self.settings, transport=self.transport)
            stack.push_async_callback(http.aclose)
            self._api = ApiClient(http, self.settings)
        return self._api

    @property
    def pacer(self) -> Pacer:
        """The pacer, which outlives passes (inside `async with` only)."""
        return _opened(self._pacer)

    async def __aenter__(self) -> Worker:
        settings = self.settings
        stack = self._stack
        try:
            self._store = await anyio.to_thread.run_sync(open_store, settings)
            stack.callback(self.store.close)
            self.store.on_lease_expired = _log_lease_expired
            stack.enter_context(self.store.single_instance_lock())
            self._vault = load_vault(settings, store=self.store)
            self.client_secret = read_client_secret(settings)
            register_secret(self.client_secret)
            self._open = stack
            if settings.webhook.url is not None:  # imported only when configured
                from lta_worker.upstream import WebhookSender, webhook_http_client

                secret = read_webhook_secret(settings)
                register_secret(secret)
                client = webhook_http_client(settings, transport=self.webhook_transport)
                hooks = await stack.enter_async_context(client)
                self.webhooks = WebhookSender(hooks, settings, secret)
            self._pacer = self._build_pacer()
            if self.store.dialect == "sqlite":  # the lock proves every other one dead
                await self._db(self.store.prune_instances, self.clock.now(), timedelta(0))
                for owner, users in (await self._db(self.store.release_all)).items():
                    _log_lease_expired(owner, users)
                await self._db(self.store.release_events, self.clock.now())
            await self._db(self.store.register_instance, self.instance, self.kind, self.clock.now())
            stack.callback(self.store.unregister, self.instance)
            if self.metrics is not None:
                await self._db(self.metrics.on_store, self.store, self.clock.now(), history=True)
                seen = await self._db(self.store.budget_seen, settings.client.id)
                self.metrics.on_budget_seen(seen, self.clock.now())
        except BaseException:
            await stack.aclose()
            self._open = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self._stack.aclose()
        self._open = self._api = None

    def _build_pacer(self) -> Pacer:
        rl = self.settings.ratelimit
        core = PacerCore(
            reserve=rl.reserve,
            fallback_per_hour=rl.fallback_per_hour,
            initial_burst=self.settings.poll.breaker_threshold,
            max_wait=rl.max_wait.total_seconds(),
        )
        shared = None
        if self.store.dialect == "postgresql":  # SQLite is single-instance (a file lock)
            service = self.settings.service
            shared = SharedBudget(
                self.store,
                self.settings.client.id,
                reserve=rl.reserve,
                clock=self.clock.now,
                probe_timeout=service.connect_timeout + service.read_timeout,
            )
        return Pacer(
            core,
            clock=self.clock.monotonic,
            sleep=self.clock.sleep,
            wall_clock=self.clock.now,
            shared=shared,
        )

    async def _db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (`request_stop`): no pass or drop starts any more."""
        return self.stop_grace is not None

    async def run_pass(
        self, *, max_duration: timedelta | None = None, on_progress: ProgressFn | None = None
    ) -> PassResult:
        """One pass with the jobs around it (`_run.run_pass`)."""
        return await run_pass(self, max_duration=max_duration, on_progress=on_progress)

    def request_stop(self, grace: float) -> None:
        """Stop the pass in progress, and any later one before it claims a user (SIGTERM).

        A pass may be between its start and its engine when the signal comes; it sees
        the request as soon as its engine exists, so it never runs on unstopped.
        """
        self.stop_grace = grace
        if self.current is not None:
            self.current.request_stop("cancelled", grace)

    def reload(self, settings: Settings, *, key_ids_in_use: Iterable[str] = ()) -> None:
        """Re-read the key file and the client secret and take the new settings (SIGHUP).

        Everything is loaded before anything is replaced, so a broken new config or key
        file leaves the running worker as it was; so does a key file that lacks one of
        `key_ids_in_use` (`UnknownKeyError`: stored tokens would no longer decrypt, and
        the next pass would stop at the first of them). What was set up at start from the
        `database`, `service`, `webhook`, `enroll` and `metrics` sections (the store, the
        HTTP client, the webhook sender, the enrollment and metrics listeners) needs a
        restart; a change to them is reported (`service.reload_partial`), not applied, so
        that the settings the worker shows are the ones in force.
        """
        vault = _vault_with(settings, key_ids_in_use)
        client_secret = read_client_secret(settings)
        fixed = ("database", "service", "webhook", "enroll", "metrics")
        changed = [k for k in fixed if getattr(settings, k) != getattr(self.settings, k)]
        if changed:
            log.warning("service.reload_partial", needs_restart=changed)
            settings = replace(settings, **{k: getattr(self.settings, k) for k in fixed})
        register_secret(client_secret)
        self._vault, self.client_secret, self.settings = vault, client_secret, settings

    def watch_key_file(self) -> str | None:
        """Read the key file again and compare it with the keys in force: what is wrong
        with it (deleted, unreadable, broken, or without a key id the keys in force hold),
        or None. The keys in force stay as they are either way; the problem is kept for
        health (`problems`) until the file is right again."""
        try:
            on_disk = load_vault(self.settings)
        except LtaError as exc:
            problem: str | None = exc.message
        else:
            lost = sorted(set(self.vault.key_ids) - set(on_disk.key_ids))
            problem = (
                f"crypto.key_file: the key file no longer holds key id(s) "
                f"{', '.join(map(repr, lost))} of the keys in force"
                if lost
                else None
            )
        self.key_file_problem = problem
        return problem

    def problems(self) -> list[str]:
        """What this process knows is wrong beyond the database (for `/healthz`)."""
        if self.key_file_problem is None:
            return []
        return [
            f"{self.key_file_problem}; running on the keys read at start: restore the file "
            "before a restart or SIGHUP"
        ]

    def reload_keys(self, *, key_ids_in_use: Iterable[str]) -> None:
        """Re-read the key file alone, under the settings in force (`serve`, when a pass
        met a token under a key id the keys in force lack). Loaded before it replaces them:
        a file that still lacks one of `key_ids_in_use` (`UnknownKeyError`) or is broken
        leaves the keys in force as they were."""
        self._vault = _vault_with(self.settings, key_ids_in_use)


def _vault_with(settings: Settings, key_ids_in_use: Iterable[str]) -> Vault:
    """The key file of `settings`, loaded; `UnknownKeyError` when it lacks a key id in use."""
    vault = load_vault(settings)
    vault.require_keys(key_ids_in_use)
    return vault
