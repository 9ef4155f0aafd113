"""`serve`: the long-running service under systemd.

APScheduler 3.11's `AsyncIOScheduler` (on the asyncio loop anyio runs on) drives three jobs:
a pass every `poll.tick` (one at a time, coalesced: a pass that overruns its tick delays
the next, never doubles it), maintenance (retention purge, WAL checkpoint) and a heartbeat.
sd_notify: READY once started, STATUS after each pass, WATCHDOG pings from the event loop
(so a blocked loop stops them), STOPPING on SIGTERM/SIGINT. A signal stops claiming, lets
in-flight reads finish within `serve.grace_period`, commits, and exits 0. SIGHUP reloads the
configuration and the key file.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from lta_worker.config import Settings
from lta_worker.errors import EX_OK, LtaError
from lta_worker.worker.clock import Clock
from lta_worker.worker.logs import get_logger
from lta_worker.worker.runner import Worker
from lta_worker.worker.sdnotify import Notifier

log = get_logger("lta_worker.service")


class Service:
    """One `serve` process: a worker, a scheduler and the signal loop."""

    def __init__(
        self,
        worker: Worker,
        notifier: Notifier,
        reload_settings: Any = None,
    ) -> None:
        self.worker = worker
        self.notifier = notifier
        self.reload_settings = reload_settings
        self.idle = anyio.Event()
        self.idle.set()
        self.stopping = False
        self.passes = 0

    @property
    def settings(self) -> Settings:
        """The settings in force (replaced by a reload)."""
        return self.worker.settings

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; return the exit code (0 after a clean stop)."""
        settings = self.settings
        scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
        common: dict[str, Any] = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        scheduler.add_job(
            self._pass_job,
            "interval",
            seconds=settings.poll.tick.total_seconds(),
            id="pass",
            next_run_time=datetime.now(UTC),
            **common,
        )
        scheduler.add_job(
            self._maintenance_job,
            "interval",
            seconds=settings.serve.maintenance_interval.total_seconds(),
            id="maintenance",
            **common,
        )
        scheduler.add_job(
            self._heartbeat_job,
            "interval",
            seconds=settings.serve.heartbeat.total_seconds(),
            id="heartbeat",
            **common,
        )
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            scheduler.start()
            self.notifier.ready("started; first pass running")
            log.info(
                "service.started",
                instance=self.worker.instance,
                tick_s=settings.poll.tick.total_seconds(),
                pid=os.getpid(),
            )
            async with anyio.create_task_group() as tg:
                if self.notifier.watchdog_interval:
                    tg.start_soon(self._watchdog, self.notifier.watchdog_interval)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        await self._reload()
                        continue
                    await self._stop(scheduler, signal.Signals(signum).name)
                    break
                tg.cancel_scope.cancel()
        log.info("service.stopped", instance=self.worker.instance, exit_code=EX_OK)
        return EX_OK

    async def _stop(self, scheduler: AsyncIOScheduler, signame: str) -> None:
        grace = self.settings.serve.grace_period.total_seconds()
        self.stopping = True
        self.notifier.stopping(f"stopping on {signame}")
        log.info("service.stopping", instance=self.worker.instance, signal=signame, grace_s=grace)
        scheduler.shutdown(wait=False)
        engine = self.worker.current
        if engine is not None:
            engine.request_stop("cancelled", grace)
        with anyio.move_on_after(grace + 2):
            await self.idle.wait()

    async def _pass_job(self) -> None:
        if self.stopping:
            return
        self.idle = anyio.Event()
        try:
            result = await self.worker.run_pass()
            self.passes += 1
            self.notifier.status(
                f"pass {self.passes}: {result.users} users, {result.reads} reads, "
                f"{result.stopped}; next within {self.settings.poll.tick}"
            )
        except LtaError as exc:
            log.error("error", error=type(exc).__name__, message=str(exc), exit_code=exc.exit_code)
            self.notifier.status(f"last pass failed: {type(exc).__name__}")
        finally:
            self.idle.set()

    async def _maintenance_job(self) -> None:
        purged = await self.worker.maintenance(checkpoint=True)
        log.info(
            "maintenance.finished",
            instance=self.worker.instance,
            purged_users=purged.users,
            checkpoint=True,
        )

    async def _heartbeat_job(self) -> None:
        await self.worker.heartbeat()
        counts = await anyio.to_thread.run_sync(self.worker.store.count_by_state)
        due = await self.worker.due_count()
        log.info(
            "service.heartbeat",
            instance=self.worker.instance,
            due=due,
            **{s: counts.get(s, 0) for s in ("active", "parked", "unlinked", "rejected")},
        )

    async def _watchdog(self, period: float) -> None:
        while True:
            self.notifier.watchdog()
            await anyio.sleep(period)

    async def _reload(self) -> None:
        try:
            settings = self.reload_settings() if self.reload_settings else self.settings
            self.worker.reload(settings)
        except LtaError as exc:
            log.error("service.reloaded", instance=self.worker.instance, ok=False, error=str(exc))
            return
        log.info("service.reloaded", instance=self.worker.instance, ok=True, error=None)


async def serve(
    settings: Settings,
    *,
    reload_settings: Any = None,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
) -> int:
    """Open a worker and serve until a stop signal; return the exit code."""
    async with Worker(settings, kind="serve", transport=transport, clock=clock) as worker:
        service = Service(worker, notifier or Notifier(), reload_settings)
        return await service.run()
