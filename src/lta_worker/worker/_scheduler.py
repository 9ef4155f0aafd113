"""`serve`'s plumbing: APScheduler jobs (`start_scheduler`, `Guard`), reload on SIGHUP
(`Reloader`) and systemd's notify protocol (`Notifier`).

Each job runs one at a time, coalesced (an overrun delays the next pass, never doubles it).
APScheduler's `shutdown()` cancels running jobs at once (`serve` pauses first), and its
plain-text records would break the JSON stream (jobs log their own errors as events).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.config import Settings
from lta_worker.errors import LtaError, StorageError
from lta_worker.logs import get_logger

# APScheduler is imported when `serve` starts it: `run` never needs it.
if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from lta_worker.worker._runtime import Worker

log = get_logger("lta_worker.service")
# The scheduler's jobs, as the `error` event's `job` names them (docs/log-events.md).
JOB_IDS: Final = ("pass", "maintenance", "heartbeat", "webhooks")
Job = Callable[[], Awaitable[None]]


def intervals(settings: Settings, *, webhooks: bool) -> dict[str, timedelta]:
    """How often each job runs under `settings` (the webhook job only with `webhook.url`)."""
    serve = settings.serve
    return {
        "pass": settings.poll.tick,
        "maintenance": serve.maintenance_interval,
        "heartbeat": serve.heartbeat,
        **({"webhooks": settings.webhook.interval} if webhooks else {}),
    }


def start_scheduler(
    jobs: Mapping[str, Job], every: Mapping[str, timedelta], first_pass: datetime
) -> AsyncIOScheduler:
    """A started scheduler running `jobs[id]` every `every[id]`; the pass first at
    `first_pass`, the others after one interval."""
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    # Its plain-text records are kept off stderr (they still reach an app's own handlers).
    logger = logging.getLogger("apscheduler")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
    for job_id, interval in every.items():
        scheduler.add_job(
            jobs[job_id],
            "interval",
            seconds=interval.total_seconds(),
            id=job_id,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            **({"next_run_time": first_pass} if job_id == "pass" else {}),
        )
    scheduler.start()
    return scheduler


def reschedule(
    scheduler: AsyncIOScheduler,
    before: Mapping[str, timedelta],
    after: Mapping[str, timedelta],
) -> None:
    """After a reload: the jobs whose interval changed run on the new one."""
    for job_id, every in after.items():
        if every != before[job_id]:
            scheduler.reschedule_job(job_id, trigger="interval", seconds=every.total_seconds())


class Guard:
    """The job runs in progress (`idle` set when none), their failures logged as `error`."""

    def __init__(self) -> None:
        self.running = 0
        self.idle = anyio.Event()
        self.idle.set()

    @asynccontextmanager
    async def run(self, name: str) -> AsyncIterator[None]:
        """Count a run of job `name`; log its failure as data (a bug with its traceback)."""
        if self.running == 0:
            self.idle = anyio.Event()
        self.running += 1
        try:
            yield
        except Exception as exc:
            known = _explained(exc)
            if known is not None:
                log.error(
                    "error",
                    job=name,
                    error=type(known).__name__,
                    message=str(known),
                    exit_code=known.exit_code,
                )
                return
            # A bug: logged with its traceback, the service goes on.
            log.error(
                "error",
                job=name,
                error=type(exc).__name__,
                message=str(exc),
                exit_code=1,
                exc_info=True,
            )
        finally:
            self.running -= 1
            if self.running == 0:
                self.idle.set()


def _explained(exc: BaseException) -> LtaError | None:
    """The `LtaError` that explains `exc` (or every leaf of its group), mapped; None for a bug."""
    from lta_worker.storage import DATABASE_ERRORS, map_driver_error

    if isinstance(exc, LtaError):
        return exc
    if isinstance(exc, DATABASE_ERRORS):
        return map_driver_error(exc)
    if not isinstance(exc, BaseExceptionGroup):
        return None
    leaves = [_explained(inner) for inner in exc.exceptions]
    if any(leaf is None for leaf in leaves):
        return None
    return leaves[0]


class Notifier:
    """Notifications to systemd's $NOTIFY_SOCKET (sd_notify(3)); the watchdog pinged at half
    its period when $WATCHDOG_USEC is set for this process (sd_watchdog_enabled(3))."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        self.watchdog_interval: float | None = int(usec) / 1e6 / 2 if watchdog else None

    @property
    def enabled(self) -> bool:
        """True when a notify socket is configured."""
        return bool(self._address)

    def notify(self, **fields: str | int) -> bool:
        """Send `KEY=VALUE` lines (keys upper-cased); False when there is no socket or it fails."""
        if not self._address:
            return False
        payload = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        """Tell systemd the service is up."""
        return self.notify(ready=1, status=status, mainpid=os.getpid())

    def status(self, text: str) -> bool:
        """Update the status line `systemctl status` shows."""
        return self.notify(status=text)

    def watchdog(self) -> bool:
        """Ping the watchdog."""
        return self.notify(watchdog=1)

    def reloading(self, status: str) -> bool:
        """Tell systemd a reload began (`ready` ends it); MONOTONIC_USEC as notify-reload needs."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify(reloading=1, status=status, monotonic_usec=usec)

    def stopping(self, status: str) -> bool:
        """Tell systemd the service is shutting down."""
        return self.notify(stopping=1, status=status)


# A reload the database keeps from completing (it holds the key ids in use) is tried again,
# RELOAD_RETRY doubling up to RELOAD_RETRY_MAX, until it completes or another SIGHUP comes.
RELOAD_RETRY: Final = 2.0
RELOAD_RETRY_MAX: Final = 60.0

ReloadFn = Callable[[], Settings]


class Reloader:
    """The reloads a `serve` process was asked for (`wanted`), run one at a time (`run`)."""

    def __init__(
        self,
        worker: Worker,
        notifier: Notifier,
        reload_settings: ReloadFn | None,
        intervals: Callable[[], dict[str, timedelta]],
    ) -> None:
        self.worker = worker
        self.notifier = notifier
        self.reload_settings = reload_settings
        self._intervals = intervals
        self._wanted = anyio.Event()

    def wanted(self) -> None:
        """A SIGHUP came: reload (several before the reload runs make one)."""
        self._wanted.set()

    async def run(self, scheduler: AsyncIOScheduler) -> None:
        """Reload on each SIGHUP, off the signal loop (a stalled database must not hold a
        SIGTERM); a reload the database kept from completing is tried again until it does."""
        retry = RELOAD_RETRY
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            if await self._reload(scheduler, retry):
                retry = RELOAD_RETRY
                continue
            with anyio.move_on_after(retry):  # or at once on the next SIGHUP
                await self._wanted.wait()
            self._wanted.set()
            retry = min(2 * retry, RELOAD_RETRY_MAX)

    async def _reload(self, scheduler: AsyncIOScheduler, retry: float) -> bool:
        """The new settings and key file, or the old ones if they are broken; False when the
        database was away (the old ones stay until the retry in `retry` s)."""
        self.notifier.reloading("reloading the configuration and the key file")
        before = self._intervals()
        try:
            settings = self.reload_settings() if self.reload_settings else self.worker.settings
            # Abandoned on a stop: a stalled database must not hold the service's exit.
            in_use = await anyio.to_thread.run_sync(
                self.worker.store.key_ids_in_use, self.worker.clock.now(), abandon_on_cancel=True
            )
            self.worker.reload(settings, key_ids_in_use=in_use)
        except StorageError as exc:
            log.error(
                "service.reloaded",
                instance=self.worker.instance,
                ok=False,
                error=str(exc),
                retry_in_s=retry,
            )
            self.notifier.ready(
                "reload waits for the database; the previous configuration "
                "stays in force until then"
            )
            return False
        except LtaError as exc:
            log.error("service.reloaded", instance=self.worker.instance, ok=False, error=str(exc))
            self.notifier.ready("reload failed, the previous configuration stays in force")
            return True
        reschedule(scheduler, before, self._intervals())
        log.info("service.reloaded", instance=self.worker.instance, ok=True, error=None)
        self.notifier.ready("reloaded")
        return True
