"""`serve`: the long-running service under systemd (docs/operations.md, *Service, timer or
cron*, *The circuit breaker in service mode*): passes and jobs on their intervals, signals,
sd_notify, and the listeners of `[metrics]` and `[enroll]`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import anyio

from lta_worker.config import Settings, format_duration
from lta_worker.domain import TRIP_HINTS, Trip
from lta_worker.errors import (
    EX_CONFIG,
    EX_OK,
    EX_TEMPFAIL,
    LtaError,
    StorageError,
    UnknownKeyError,
)
from lta_worker.logs import get_logger
from lta_worker.runtime import Clock
from lta_worker.worker import _jobs as jobs
from lta_worker.worker._pass import PassResult
from lta_worker.worker._runtime import Worker
from lta_worker.worker._scheduler import (
    Guard,
    Job,
    Notifier,
    Reloader,
    ReloadFn,
    intervals,
    start_scheduler,
)

if TYPE_CHECKING:
    import httpx
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = get_logger("lta_worker.service")
# Beyond the grace period, what a stopped pass needs to commit and release its leases.
STOP_MARGIN: Final = 2.0
# Beyond the grace period, the longest a stop waits for a stalled database before `serve`
# exits 75, well within the unit's TimeoutStopSec (30 s at the default grace).
STOP_BOUND: Final = 3 * STOP_MARGIN
# How often a `serve` whose breaker tripped tries a pass again (a reload: at the next tick).
BREAKER_RETRY: Final = timedelta(minutes=5)


class Service:
    """One `serve` process: a worker, a scheduler and the signal loop."""

    def __init__(
        self, worker: Worker, notifier: Notifier, reload_settings: ReloadFn | None = None
    ) -> None:
        self.worker = worker
        self.notifier = notifier
        self.stopping = False
        self.passes = 0
        self.exit_code = EX_OK
        self._fatal = anyio.Event()
        self._fatal_cause = ""  # what `_fatal` stops for, for sd_notify's STATUS
        # What ends the process after `service.stopped` when it stops on its own (exit 78).
        self.stop_error: LtaError | None = None
        self.breaker: Trip | None = None  # the cause, while the breaker keeps passes off
        self.guard = Guard()
        self.bounded = False  # a stop past `STOP_BOUND` ends the process (the command only)
        self.deadline: threading.Timer | None = None
        self.reloader = Reloader(worker, notifier, reload_settings, self._intervals)

    @property
    def settings(self) -> Settings:
        """The settings in force (replaced by a reload)."""
        return self.worker.settings

    def _intervals(self) -> dict[str, timedelta]:
        return intervals(self.settings, webhooks=self.worker.webhooks is not None)

    def _scheduled(self, name: str, job: Callable[[Worker], Any]) -> Job:
        """`job` of the worker as the scheduler runs it: guarded, and not once stopping."""

        async def run() -> None:
            if not self.stopping:
                async with self.guard.run(name):
                    await job(self.worker)

        return run

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; return the exit code (0 after a clean stop)."""
        jobs_by_id = {
            "pass": self._pass_job,
            "maintenance": self._scheduled("maintenance", jobs.maintain),
            "heartbeat": self._scheduled("heartbeat", jobs.report_heartbeat),
            "webhooks": self._scheduled("webhooks", jobs.deliver_webhooks),
        }
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            # Held since the process's first line (`lta_worker.__main__`): a reload asked for
            # during start-up must not end it. With the handler in place, a pending one comes.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
            scheduler = start_scheduler(jobs_by_id, self._intervals(), self.worker.clock.now())
            self.notifier.ready("started; first pass running")
            log.info(
                "service.started",
                instance=self.worker.instance,
                tick_s=self.settings.poll.tick.total_seconds(),
                pid=os.getpid(),
            )
            async with anyio.create_task_group() as tg:
                if self.notifier.watchdog_interval:
                    tg.start_soon(self._watchdog, self.notifier.watchdog_interval)
                tg.start_soon(self._stop_when_fatal, scheduler, tg.cancel_scope)
                tg.start_soon(self.reloader.run, scheduler)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        self.reloader.wanted()  # several before it runs: one reload
                        continue
                    await self._stop(scheduler, signal.Signals(signum).name)
                    break
                tg.cancel_scope.cancel()
        level = "info" if self.exit_code == EX_OK else "error"
        getattr(log, level)(
            "service.stopped", instance=self.worker.instance, exit_code=self.exit_code
        )
        return self.exit_code

    async def _stop_when_fatal(self, scheduler: AsyncIOScheduler, scope: anyio.CancelScope) -> None:
        """Stop the service once a pass met a configuration problem (`_config_stop`)."""
        await self._fatal.wait()
        if not self.stopping:
            await self._stop(scheduler, None)
        scope.cancel()

    async def _stop(self, scheduler: AsyncIOScheduler, signame: str | None) -> None:
        """Stop claiming, let the running jobs finish within the grace period, then end."""
        grace = self.settings.serve.grace_period.total_seconds()
        self.stopping = True
        if self.bounded and self.deadline is None:
            bound = grace + STOP_BOUND
            self.deadline = threading.Timer(bound, self._abandon, (bound,))
            self.deadline.daemon = True
            self.deadline.start()
        self.notifier.stopping(
            f"stopping on {signame}" if signame else f"stopping: {self._fatal_cause}"
        )
        if signame is not None:
            log.info(
                "service.stopping", instance=self.worker.instance, signal=signame, grace_s=grace
            )
        # Pause, not shutdown: shutdown would cancel the running pass outright, losing its
        # finished reads and leaving its users leased instead of due.
        scheduler.pause()
        self.worker.request_stop(grace)
        with anyio.move_on_after(grace + STOP_MARGIN):
            await self.guard.idle.wait()
        scheduler.shutdown(wait=False)  # cancels whatever still runs past the grace period
        with anyio.move_on_after(STOP_MARGIN):
            await self.guard.idle.wait()

    def _abandon(self, waited: float) -> None:
        """The stop waited `waited` s for the database: exit 75 now, from this timer thread."""
        log.error(
            "error",
            error=StorageError.__name__,
            message=f"the stop waited {waited:.0f} s for the database, which does not answer",
            hint="nothing committed is lost; check that the database is up and reachable",
            exit_code=EX_TEMPFAIL,
        )
        sys.stderr.flush()
        os._exit(EX_TEMPFAIL)

    async def _pass_job(self) -> None:
        """Every `poll.tick` (every `BREAKER_RETRY` while the breaker is open): the key file
        checked, then a pass; a key id still missing stops the service."""
        if self.stopping:
            return
        retry_at = self.worker.breaker_retry_at  # cleared by a reload
        if retry_at is not None and self.worker.clock.now() < retry_at:
            return  # the breaker is open: checked again at its slow pace
        failed = True
        config_error: UnknownKeyError | None = None
        async with self.guard.run("pass"):
            # Counted as the pass: a stop meanwhile waits for it, and then no pass starts.
            await jobs.check_key_file(self.worker)
            if self.stopping:
                return
            # Only a key id the key file lacks stops the service: other exit-78 errors (a
            # database file that cannot be opened) also come from a machine out of file
            # descriptors, which passes, and a unit kept down by 78 would not come back.
            try:
                result = await self.worker.run_pass()
            except UnknownKeyError as exc:
                if await jobs.take_new_keys(self.worker, exc):
                    return  # the next pass reads that user with them
                config_error = exc
                raise  # the guard logs the `error` line
            failed = False
            self.passes += 1
            if result.stopped == "breaker":
                self._trip(result)
            elif self.breaker is not None:
                self._close()
            self.notifier.status(
                f"pass {self.passes}: {result.users} users, {result.reads} reads, "
                f"{result.throttled} throttled, {result.stopped}; "
                f"next within {format_duration(self.settings.poll.tick)}"
            )
        if config_error is not None:
            self._config_stop(config_error)
        if failed and not self.stopping:
            self.notifier.status("last pass failed; see the log")

    def _trip(self, result: PassResult) -> None:
        """The breaker tripped: no pass until `BREAKER_RETRY` from now (or a reload)."""
        retry = max(BREAKER_RETRY, self.settings.poll.tick)
        self.worker.breaker_retry_at = self.worker.clock.now() + retry
        if self.breaker is None:
            self.breaker = result.cause or "plain_401"
            log.error(
                "service.breaker_open",
                instance=self.worker.instance,
                cause=self.breaker,
                retry_s=retry.total_seconds(),
                hint=f"{TRIP_HINTS[self.breaker]}; serve stays up, unhealthy, and runs a "
                f"pass again every {format_duration(retry)} until the cause is gone: fix it, "
                "then `systemctl reload lta-worker.service` to check at once",
            )

    def _close(self) -> None:
        """A pass after a trip was not stopped by the breaker: the ticks go on."""
        log.info("service.breaker_closed", instance=self.worker.instance, cause=self.breaker)
        self.breaker = None
        self.worker.breaker_retry_at = None

    def _config_stop(self, exc: UnknownKeyError) -> None:
        """A pass met a key id the key file lacks, read again: stop reading, and exit 78."""
        self.stop_error, self.exit_code = exc, EX_CONFIG
        self._fatal_cause = "configuration error"
        log.error(
            "service.config_stop",
            instance=self.worker.instance,
            exit_code=EX_CONFIG,
            error=type(exc).__name__,
            key=exc.key,
            hint=f"the key file, read again, still lacks key id {exc.key_id!r}: a line removed "
            "before `keys rotate` reported failed = 0 (restore it), or a key added after the "
            "start to a file the unit copies at start (LoadCredential: restart the unit, step "
            "2 of key rotation); serve stops instead of failing every pass",
        )
        self._fatal.set()

    async def _watchdog(self, period: float) -> None:
        """Every `period`: tell systemd the event loop is alive."""
        while True:
            self.notifier.watchdog()
            await self.worker.clock.sleep(period)


async def serve(
    settings: Settings,
    *,
    reload_settings: ReloadFn | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
    bounded: bool = False,
) -> int:
    """Open a worker and serve until a stop signal; return the exit code. `bounded`: a stop
    that waits `STOP_BOUND` past the grace period for the database ends the process (75)."""
    service: Service | None = None
    try:
        async with Worker(settings, kind="serve", transport=transport, clock=clock) as worker:
            service = Service(worker, notifier or Notifier(), reload_settings)
            service.bounded = bounded
            server = None
            if settings.metrics.listen:  # imported only when configured
                from lta_worker.worker._metrics_http import metrics_server

                server = metrics_server(worker)
            try:
                if settings.enroll.listen is None:
                    code = await service.run()
                else:
                    # Imported only here: starlette and uvicorn are the optional `[web]` extra.
                    from lta_worker.worker._enroll import enroll_listener

                    async with enroll_listener(worker):
                        code = await service.run()
            finally:
                if server is not None:
                    server.close()
    finally:
        # Stopped in time: the bound is off. A job still stuck in the database keeps it.
        if service is not None and service.deadline is not None and service.guard.idle.is_set():
            service.deadline.cancel()
    if service.stop_error is not None:  # the CLI writes it: the `error` event, the last line
        raise service.stop_error
    return code
