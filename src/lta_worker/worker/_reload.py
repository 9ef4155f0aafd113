"""`serve`'s reload on SIGHUP: the new settings and key file, or the old ones if they are
broken; a reload the database keeps from completing (the key ids stored tokens use are read
from it) is tried again, `RELOAD_RETRY` doubling up to `RELOAD_RETRY_MAX`, until it completes
or another SIGHUP comes, never lost. It runs off the signal loop: a stalled database must not
hold a SIGTERM."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.config import Settings
from lta_worker.errors import LtaError, StorageError
from lta_worker.logs import get_logger
from lta_worker.worker._runtime import Worker
from lta_worker.worker._scheduler import reschedule
from lta_worker.worker._sdnotify import Notifier

if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = get_logger("lta_worker.service")
# A reload the database kept from completing is tried again after this many seconds,
# doubling up to the maximum, until it completes or another SIGHUP comes.
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
        """On SIGHUP: the new settings and key file, or the old ones if they are broken.
        False when the database was away: the old ones stay until the retry in `retry` s."""
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
