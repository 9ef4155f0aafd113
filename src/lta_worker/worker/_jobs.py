"""The worker's jobs, each a small function of the `Worker`: before, alongside and after a
pass (`Worker.run_pass`), and on their own intervals in `serve` (`_scheduler`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.domain import PassRecord, PendingEvent, PurgeCounts, backoff_delay
from lta_worker.errors import LtaError, StorageError, UnknownKeyError
from lta_worker.logs import get_logger
from lta_worker.runtime import instance_ttl
from lta_worker.worker._pass import PassResult, on_thread

if TYPE_CHECKING:
    from lta_worker.enrollment import DropRetries
    from lta_worker.pacing import SharedBudget
    from lta_worker.worker._runtime import Worker

log = get_logger("lta_worker.runner")
service_log = get_logger("lta_worker.service")
# The states `service.heartbeat` counts.
HEARTBEAT_STATES = ("active", "parked", "unlinked", "rejected")


async def heartbeat(rt: Worker) -> None:
    """Every `serve.heartbeat`: mark this instance alive, registering it again if pruned."""
    if not await on_thread(rt.store.heartbeat, rt.instance, rt.clock.now()):
        await on_thread(rt.store.register_instance, rt.instance, rt.kind, rt.clock.now())


async def refresh_share(rt: Worker) -> None:
    """Before each pass and each beat during one: the pacer's share, 1 / live instances."""
    live = await on_thread(rt.store.live_instances, rt.clock.now(), instance_ttl(rt.settings))
    rt.pacer.set_share(1.0 / max(1, len(live)))


async def keep_alive(rt: Worker) -> None:
    """While a pass runs, every `serve.heartbeat`: a heartbeat (a `run` pass may outlast an
    instance's time to live) and the share."""
    while True:
        await rt.clock.sleep(rt.settings.serve.heartbeat.total_seconds())
        try:
            await heartbeat(rt)
            await refresh_share(rt)
        except StorageError as exc:  # the pass itself will meet it if it lasts
            log.warning("error", error=type(exc).__name__, message=str(exc))


async def settle_shared(rt: Worker, shared: SharedBudget) -> None:
    """While a pass runs (PostgreSQL): settle answers in the shared budget; retry a second later."""
    while True:
        try:
            await shared.settle_forever()
        except StorageError as exc:
            log.warning("error", error=type(exc).__name__, message=str(exc))
            await rt.clock.sleep(1.0)


async def follow_schedule(rt: Worker) -> dict[str, int] | None:
    """Before each pass: reschedule the users when `poll.interval` or `parked_interval`
    changed (after a reload that changed them, `Worker.replan`, whatever was applied)."""
    poll = rt.settings.poll
    floor, rt.replan = rt.replan, None
    try:
        moved = await on_thread(
            partial(rt.store.follow_schedule, force=floor is not None, floor=floor),
            poll.interval,
            poll.parked_interval,
            rt.clock.now(),
        )
    except BaseException:
        if floor is not None:  # the next pass tries again
            rt.replan = max(rt.replan or floor, floor)
        raise
    if moved is not None:
        log.info(
            "schedule.followed",
            interval_s=poll.interval.total_seconds(),
            parked_interval_s=poll.parked_interval.total_seconds(),
            **{f"users_{due_class}": count for due_class, count in moved.items()},
        )
    return moved


async def retry_drops(rt: Worker) -> DropRetries:
    """Before each pass: send again, through the pacer, the DELETEs of pending drops."""
    lifecycle = rt.lifecycle()  # its API client is built only if a drop is due
    if rt.rng is not None:
        lifecycle.rng = rt.rng
    return await lifecycle.retry_pending(
        rt.pacer,
        owner=rt.instance,
        lease=rt.settings.poll.lease_duration,
        stopping=lambda: rt.stopping,
    )


async def record_pass(rt: Worker, result: PassResult, started_at: datetime) -> PassRecord:
    """After each pass: its record, and the budget seen (unless a shared row keeps it live)."""
    record = PassRecord(
        instance=rt.instance,
        started_at=started_at,
        finished_at=rt.clock.now(),
        stopped=result.stopped,
        exit_code=result.exit_code,
        reads=result.reads,
        throttled=result.throttled,
        counts=dict(result.counts),
    )
    await on_thread(rt.store.record_pass, record)
    await keep_budget(rt)
    return record


async def keep_budget(rt: Worker) -> None:
    """The budget the pacer last saw into the store, unless a shared row keeps it live."""
    budget = rt.pacer.budget_seen(rt.clock.now())
    if budget is not None and rt.pacer.shared is None:
        await on_thread(rt.store.record_budget, rt.settings.client.id, budget)


async def purge(rt: Worker, *, checkpoint: bool = False) -> PurgeCounts:
    """The retention purge, old dead letters (every event without `webhook.url`: it has no
    reader), and with `checkpoint` a WAL checkpoint."""
    retention = rt.settings.retention
    purged = await on_thread(
        rt.store.purge_expired, rt.clock.now(), retention.after_revocation, retention.history
    )
    if purged.users or purged.snapshots or purged.history or purged.history_pruned:
        log.info(
            "retention.purged",
            users=purged.users,
            snapshots=purged.snapshots,
            history=purged.history,
            history_pruned=purged.history_pruned,
        )
    delivering = rt.webhooks is not None
    events = await on_thread(
        rt.store.purge_events, rt.clock.now(), rt.settings.webhook.keep_dead, live=not delivering
    )
    if events:  # without webhook.url, routine housekeeping: at debug only
        (log.info if delivering else log.debug)(
            "webhook.purged", events=events, delivering=delivering
        )
    if checkpoint:
        await on_thread(rt.store.checkpoint)
    return purged


async def update_metrics(rt: Worker, result: PassResult, finished_at: datetime) -> None:
    """After each pass: the metrics, and the textfile (logged, never failing, if unwritable)."""
    if rt.metrics is None:
        return
    rt.metrics.on_pass(result, finished_at)
    await on_thread(rt.metrics.on_store, rt.store, rt.clock.now())
    path = rt.settings.metrics.textfile
    if path is None:
        return
    try:
        await on_thread(rt.metrics.write_textfile, path)
    except OSError as exc:
        log.error(
            "metrics.write_failed",
            path=str(path),
            error=exc.strerror or type(exc).__name__,
            hint="make metrics.textfile's directory writable by the user running lta-worker",
        )


async def after_pass(rt: Worker, result: PassResult, started_at: datetime) -> None:
    """After each pass, in order: its record, the retention purge, the metrics."""
    record = await record_pass(rt, result, started_at)
    await purge(rt)
    await update_metrics(rt, result, record.finished_at)


async def maintain(rt: Worker) -> PurgeCounts:
    """Every `serve.maintenance_interval`: `purge` with a checkpoint, `maintenance.finished`."""
    purged = await purge(rt, checkpoint=True)
    service_log.info(
        "maintenance.finished", instance=rt.instance, purged_users=purged.users, checkpoint=True
    )
    return purged


async def report_heartbeat(rt: Worker) -> None:
    """Every `serve.heartbeat` in `serve`: a `heartbeat`, then `service.heartbeat` (counts)."""
    await heartbeat(rt)
    counts = await on_thread(rt.store.count_by_state)
    due = await on_thread(rt.store.count_due, rt.clock.now())
    service_log.info(
        "service.heartbeat",
        instance=rt.instance,
        due=due,
        **{state: counts.get(state, 0) for state in HEARTBEAT_STATES},
    )


async def check_key_file(rt: Worker) -> None:
    """Before each `serve` pass: log once a key file lost (`Worker.problems` then holds it),
    or back."""
    before = rt.key_file_problem
    problem = await on_thread(rt.watch_key_file)
    if problem == before:
        return
    if problem is None:
        service_log.info("service.key_file_back", instance=rt.instance)
        return
    service_log.error(
        "service.key_file_lost",
        instance=rt.instance,
        key="crypto.key_file",
        message=problem,
        hint="the service goes on with the keys it read at start; restore the key file "
        "before a restart or SIGHUP, or the stored tokens will not decrypt",
    )


async def take_new_keys(rt: Worker, exc: UnknownKeyError) -> bool:
    """After a `serve` pass met an unknown key id: read the key file again, as a SIGHUP
    would (a key added since: step 1 of key rotation); True if it helped."""
    try:
        in_use = await on_thread(rt.store.key_ids_in_use, rt.clock.now())
        rt.reload_keys(key_ids_in_use=in_use)
    except LtaError:
        return False
    service_log.info("service.keys_reloaded", instance=rt.instance, key_id=exc.key_id)
    return True


# The webhook delivery (docs/webhooks.md): rounds repeat while events are acknowledged.
webhook_log = get_logger("lta_worker.webhook")

BATCH: Final = 20
SENDERS: Final = 4
BACKOFF_BASE: Final = timedelta(seconds=5)
BACKOFF_CAP: Final = timedelta(minutes=15)
MIN_RETRY: Final = timedelta(seconds=1)


@dataclass(slots=True)
class Delivery:
    """What one round did."""

    delivered: int = 0
    failed: int = 0
    dead: int = 0


async def deliver_webhooks(rt: Worker) -> Delivery:
    """After a `run` pass, and every `webhook.interval` in `serve`: one delivery round."""
    report = Delivery()
    sender, store, now = rt.webhooks, rt.store, rt.clock.now
    if sender is None:
        return report
    rng = rt.rng or random.Random()
    cfg = rt.settings.webhook
    report.dead = await on_thread(store.dead_letter_events, now(), cfg.max_age)
    if report.dead:
        webhook_log.error(
            "webhook.dead_lettered", events=report.dead, max_age_s=cfg.max_age.total_seconds()
        )
    lease = 2 * cfg.timeout + timedelta(seconds=5)
    outcomes: dict[int, str | None] = {}  # each event's error, or None
    limiter = anyio.CapacityLimiter(SENDERS)

    async def send(event: PendingEvent) -> None:
        async with limiter:
            outcomes[event.id] = await sender.send(event, now())

    while True:
        start = now()
        batch = await on_thread(store.claim_events, start, BATCH, start + lease, rt.instance)
        if not batch:
            return report
        wanted = [e for e in batch if e.type in cfg.events]
        outcomes.clear()
        async with anyio.create_task_group() as tg:  # one event per user, SENDERS at a time
            for event in wanted:
                tg.start_soon(send, event)
        done = [e for e in batch if outcomes.get(e.id) is None]
        await on_thread(store.events_delivered, [e.id for e in done])
        for event in done:
            if event.id not in outcomes:
                continue  # not wanted: deleted unsent
            webhook_log.info(
                "webhook.delivered",
                event_id=event.event_id,
                type=event.type,
                attempts=event.attempts,
            )
        for event in wanted:
            error = outcomes[event.id]
            if error is None:
                continue
            delay = max(
                MIN_RETRY,
                backoff_delay(event.attempts, base=BACKOFF_BASE, cap=BACKOFF_CAP, rng=rng),
            )
            await on_thread(store.event_failed, event.id, now() + delay, error)
            webhook_log.warning(
                "webhook.failed",
                event_id=event.event_id,
                type=event.type,
                attempts=event.attempts,
                error=error,
                retry_in_s=round(delay.total_seconds(), 1),
            )
        report.delivered += len(done) - (len(batch) - len(wanted))
        report.failed += len(batch) - len(done)
        if not done:
            return report
