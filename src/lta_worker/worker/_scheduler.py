"""`serve`'s scheduler: APScheduler 3.11 runs each job on its interval, one run at a time.

`AsyncIOScheduler` runs on the asyncio loop anyio runs on. Each job (`JOB_IDS`) runs every
its interval, at most one run at a time and coalesced: a pass that overruns its tick delays
the next, never doubles it. `Guard` counts the runs in progress (a stop waits for none to
run) and turns a failure into an `error` event naming the job; the service goes on.

Two traps of APScheduler 3 shape this: `shutdown()` cancels the asyncio tasks of running
coroutine jobs at once (so `serve` pauses first and shuts down only after the grace period),
and the scheduler logs through the standard library in plain text (a skipped tick during a
long pass is a warning), which would break the JSON log stream; jobs therefore report their
own errors as events and the scheduler's records are not printed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.config import Settings
from lta_worker.errors import LtaError
from lta_worker.logs import get_logger

# APScheduler is imported when `serve` starts it: `run` never needs it.
if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

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

    _quiet_scheduler_logs()
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
    """The job runs in progress, counted (`idle` is set when none runs), and their
    failures logged as `error` events."""

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
    """The `LtaError` that explains `exc`: itself (a database error that escaped the storage
    layer's mapping, mapped), or the first of an exception group (a pass's task groups wrap
    what a reader raises) whose every leaf is one; None for a bug."""
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


def _quiet_scheduler_logs() -> None:
    """Keep APScheduler's plain-text records off stderr (only JSON lines go there).

    A handler on the `apscheduler` logger stops the standard library's last-resort
    printing; records still propagate to handlers an embedding application installs.
    """
    logger = logging.getLogger("apscheduler")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
