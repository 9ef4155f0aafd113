"""The long-lived collaborators of passes, built from settings: what `run` and `serve` share.

`Worker` opens the store (migrating it), takes the single-instance lock on SQLite, loads
the key file and the client secret, builds the HTTP client, API client and pacer, and
registers the instance. It runs passes and the maintenance that follows them, and closes
everything on exit. Tests build it with the simulator's transport and their own clock.

Longer than the ~400-line ceiling: the Worker is the one owner of a pass's collaborators,
and the jobs around passes (heartbeat, maintenance, pending drops, webhook delivery,
metrics) are short methods on it; the pass itself (`_engine`), its plan (`_plan`), metrics
(`_metrics`) and webhooks (`_webhooks`) live in their own modules.
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
from lta_worker.domain import Answer, Endpoint, PassRecord, PolicyConfig, PurgeCounts
from lta_worker.errors import LtaError, StorageError
from lta_worker.logs import get_logger, register_secret
from lta_worker.pacing import Pacer, PacerCore, SharedBudget
from lta_worker.report import PlanCache, instance_ttl
from lta_worker.secret import Secret
from lta_worker.worker._clock import Clock, SystemClock
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn
from lta_worker.worker._webhooks import Delivery, deliver_due
from lta_worker.worker._wiring import load_vault, open_store

if TYPE_CHECKING:
    import httpx

    from lta_worker.enrollment import DropRetries
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient, WebhookSender
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


def pass_options(settings: Settings, instance: str, max_duration: timedelta | None) -> PassOptions:
    """Pass options from settings (`--max-duration` overrides `poll.max_pass_duration`)."""
    poll = settings.poll
    return PassOptions(
        instance=instance,
        client_scopes=settings.client.scopes,
        policy=PolicyConfig.from_settings(poll),
        max_duration=max_duration or poll.max_pass_duration,
        concurrency=poll.concurrency,
        batch_size=poll.batch_size,
        lease_duration=poll.lease_duration,
        breaker_threshold=poll.breaker_threshold,
        upstream_down_after=max(20, 2 * poll.concurrency),
        grace=settings.serve.grace_period,
        max_wait=settings.ratelimit.max_wait.total_seconds(),
        request_timeout=settings.service.request_timeout,
    )


class _ApiOnFirstRead:
    """The pass's reader: the worker's API client, asked for at the first read."""

    __slots__ = ("_worker",)

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def read(self, endpoint: Endpoint, credential: Secret) -> Answer:
        """`ApiClient.read`."""
        return await self._worker.api.read(endpoint, credential)


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
        self.current: PassEngine | None = None
        self._stop_grace: float | None = None
        self._plans = PlanCache()  # the freshness plan, renewed every few minutes
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

    async def due_count(self) -> int:
        """Users due now."""
        return int(await self._db(self.store.count_due, self.clock.now()))

    async def run_pass(
        self, *, max_duration: timedelta | None = None, on_progress: ProgressFn | None = None
    ) -> PassResult:
        """Pending drops, one pass over the due users, then its bookkeeping.

        Drops the service has not confirmed yet (users `dropping`, due for a retry) are
        sent again first, through the pacer, so they spend the same budget as the reads.
        """
        await self._refresh_share()
        await self.follow_schedule()
        await self.retry_drops()
        options = pass_options(self.settings, self.instance, max_duration)
        plan = await self._db(
            self._plans.get, self.store, self.settings, options.policy, self.clock.now()
        )
        options = replace(options, policy=replace(options.policy, plan=plan))
        if self.metrics is not None:
            self.metrics.on_plan(plan)
        engine = PassEngine(
            store=self.store,
            vault=self.vault,
            api=_ApiOnFirstRead(self),
            pacer=self.pacer if self.metrics is None else self.metrics.metered(self.pacer),
            clock=self.clock,
            client_secret=self.client_secret,
            options=options,
            rng=self.rng,
            on_progress=on_progress,
            on_read=None if self.metrics is None else self.metrics.on_read,
        )
        if self._stop_grace is not None:
            engine.request_stop("cancelled", self._stop_grace)
        self.current = engine
        started_at = self.clock.now()
        error: Exception | None = None
        try:
            async with anyio.create_task_group() as alongside:
                alongside.start_soon(self._alongside_pass)
                try:
                    result = await engine.run()
                except Exception as exc:  # raised below, outside the task group
                    error = exc
                alongside.cancel_scope.cancel()
        finally:
            self.current = None
            if self.pacer.shared is not None:
                with anyio.CancelScope(shield=True):
                    await self.pacer.shared.flush(release=True)
        if error is not None:
            raise error
        with anyio.CancelScope(shield=True):
            await self._after_pass(result, started_at)
        # `run`: the pass's events go out before it exits (not shielded: a stop may cut the
        # delivery short). `serve` delivers from its own job: a slow receiver must never hold
        # the next pass, nor share the sender's connections with a second delivery.
        if self._stop_grace is None and self.kind != "serve":
            await self.deliver_webhooks()
        return result

    async def follow_schedule(self) -> dict[str, int] | None:
        """Reschedule users when `poll.interval` / `poll.parked_interval` changed (by class).

        Called before every pass, so a new interval applies at the next `run`, and in
        `serve` at the first pass after a restart or a SIGHUP reload.
        """
        poll = self.settings.poll
        moved: dict[str, int] | None = await self._db(
            self.store.follow_schedule, poll.interval, poll.parked_interval, self.clock.now()
        )
        if moved is not None:
            log.info(
                "schedule.followed",
                interval_s=poll.interval.total_seconds(),
                parked_interval_s=poll.parked_interval.total_seconds(),
                **{f"users_{due_class}": count for due_class, count in moved.items()},
            )
        return moved

    async def retry_drops(self) -> DropRetries:
        """Send again the DELETE of the users whose drop is pending (see `Lifecycle`)."""
        from lta_worker.enrollment import Lifecycle

        lifecycle = Lifecycle(
            self.settings,
            self.store,
            self.vault,
            lambda: self.api,  # built only if a drop is due
            self.clock.now,
            client_secret=self.client_secret,
        )
        if self.rng is not None:
            lifecycle.rng = self.rng
        return await lifecycle.retry_pending(
            self.pacer,
            owner=self.instance,
            lease=self.settings.poll.lease_duration,
            stopping=lambda: self._stop_grace is not None,
        )

    async def _alongside_pass(self) -> None:
        """While a pass runs: heartbeats, the share of live instances, shared settlements.

        A `run` pass may last longer than an instance's time to live; without heartbeats
        the others would take it for dead and spend its share.
        """
        async with anyio.create_task_group() as tg:
            if self.pacer.shared is not None:
                tg.start_soon(self._settle_shared, self.pacer.shared)
            while True:
                await self.clock.sleep(self.settings.serve.heartbeat.total_seconds())
                try:
                    await self.heartbeat()
                    await self._refresh_share()
                except StorageError as exc:  # the pass itself will meet it if it lasts
                    log.warning("error", error=type(exc).__name__, message=str(exc))

    async def _settle_shared(self, shared: SharedBudget) -> None:
        """Write answers to the shared budget as they come; kept for a retry on failure."""
        while True:
            try:
                await shared.settle_forever()
            except StorageError as exc:
                log.warning("error", error=type(exc).__name__, message=str(exc))
                await self.clock.sleep(1.0)

    async def _refresh_share(self) -> None:
        """This instance's share of the budget: 1 / live instances."""
        ttl = instance_ttl(self.settings)
        live = await self._db(self.store.live_instances, self.clock.now(), ttl)
        self.pacer.set_share(1.0 / max(1, len(live)))

    async def _after_pass(self, result: PassResult, started_at: Any) -> None:
        record = PassRecord(
            instance=self.instance,
            started_at=started_at,
            finished_at=self.clock.now(),
            stopped=result.stopped,
            exit_code=result.exit_code,
            reads=result.reads,
            throttled=result.throttled,
            counts=dict(result.counts),
        )
        await self._db(self.store.record_pass, record)
        budget = self.pacer.budget_seen(self.clock.now())
        if budget is not None and self.pacer.shared is None:  # a shared row is kept live
            await self._db(self.store.record_budget, self.settings.client.id, budget)
        await self.maintenance(checkpoint=False)
        if self.metrics is not None:
            await self._update_metrics(result, record.finished_at)

    async def _update_metrics(self, result: PassResult, finished_at: Any) -> None:
        """Metrics after a pass; with `metrics.textfile`, written out (a failure is logged,
        never the pass's)."""
        assert self.metrics is not None
        self.metrics.on_pass(result, finished_at)
        await self._db(self.metrics.on_store, self.store, self.clock.now())
        path = self.settings.metrics.textfile
        if path is not None:
            try:
                await self._db(self.metrics.write_textfile, path)
            except OSError as exc:
                log.error(
                    "metrics.write_failed",
                    path=str(path),
                    error=exc.strerror or type(exc).__name__,
                    hint="make metrics.textfile's directory writable by the user running "
                    "lta-worker",
                )

    async def deliver_webhooks(self) -> Delivery:
        """One delivery round of the webhook outbox (nothing without `webhook.url`)."""
        if self.webhooks is None:
            return Delivery()
        return await deliver_due(
            self.store,
            self.webhooks,
            self.settings,
            self.clock.now,
            rng=self.rng,
            owner=self.instance,
        )

    async def maintenance(self, *, checkpoint: bool = True) -> PurgeCounts:
        """The retention purge, old dead letters (and a WAL checkpoint in `serve`).

        Without `webhook.url` the outbox has no reader: its events are deleted here.
        """
        retention = self.settings.retention
        purged: PurgeCounts = await self._db(
            self.store.purge_expired,
            self.clock.now(),
            retention.after_revocation,
            retention.history,
        )
        if purged.users or purged.snapshots or purged.history or purged.history_pruned:
            log.info(
                "retention.purged",
                users=purged.users,
                snapshots=purged.snapshots,
                history=purged.history,
                history_pruned=purged.history_pruned,
            )
        webhook = self.settings.webhook
        events = await self._db(
            self.store.purge_events,
            self.clock.now(),
            webhook.keep_dead,
            live=self.webhooks is None,
        )
        if events:  # without webhook.url, routine housekeeping: at debug only
            emit = log.info if self.webhooks is not None else log.debug
            emit("webhook.purged", events=events, delivering=self.webhooks is not None)
        if checkpoint:
            await self._db(self.store.checkpoint)
        return purged

    def request_stop(self, grace: float) -> None:
        """Stop the pass in progress, and any later one before it claims a user (SIGTERM).

        A pass may be between its start and its engine when the signal comes; it sees
        the request as soon as its engine exists, so it never runs on unstopped.
        """
        self._stop_grace = grace
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

    async def heartbeat(self) -> None:
        """Tell the other instances this one is alive (registering again if pruned)."""
        if not await self._db(self.store.heartbeat, self.instance, self.clock.now()):
            await self._db(self.store.register_instance, self.instance, self.kind, self.clock.now())


def _vault_with(settings: Settings, key_ids_in_use: Iterable[str]) -> Vault:
    """The key file of `settings`, loaded; `UnknownKeyError` when it lacks a key id in use."""
    vault = load_vault(settings)
    vault.require_keys(key_ids_in_use)
    return vault
