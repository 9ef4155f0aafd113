"""Delivering the webhook outbox: oldest event of each user first, backed off on failure.

One round (`deliver_due`): dead-letter what grew older than `webhook.max_age`, then claim
the oldest due event of each user, POST them (a few at a time, never two of one user), and
delete the acknowledged ones (and, unsent, those of a type `webhook.events` leaves out:
queued before the setting changed) or back the others off (exponential with full jitter, 5 s
doubling up to 15 min). It repeats while events keep being acknowledged, so a user's next
event follows at once; a failing receiver ends the round. `serve` runs a round every
`webhook.interval`; `run` runs one after its pass.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.config import Settings
from lta_worker.domain import PendingEvent, backoff_delay
from lta_worker.logs import get_logger

if TYPE_CHECKING:
    from lta_worker.storage import Store
    from lta_worker.upstream import WebhookSender

log = get_logger("lta_worker.webhook")

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


async def deliver_due(
    store: Store,
    sender: WebhookSender,
    settings: Settings,
    now: Callable[[], datetime],
    *,
    rng: random.Random | None = None,
    owner: str = "-",
) -> Delivery:
    """Deliver every due event once (see the module); return the counts."""
    rng = rng or random.Random()
    cfg = settings.webhook
    report = Delivery()
    report.dead = await anyio.to_thread.run_sync(store.dead_letter_events, now(), cfg.max_age)
    if report.dead:
        log.error(
            "webhook.dead_lettered", events=report.dead, max_age_s=cfg.max_age.total_seconds()
        )
    lease = 2 * cfg.timeout + timedelta(seconds=5)
    while True:
        start = now()
        batch = await anyio.to_thread.run_sync(
            store.claim_events, start, BATCH, start + lease, owner
        )
        if not batch:
            return report
        wanted = [e for e in batch if e.type in cfg.events]
        outcomes = await _send_all(sender, wanted, now)
        done = [e for e in batch if outcomes.get(e.id) is None]
        await anyio.to_thread.run_sync(store.events_delivered, [e.id for e in done])
        for event in done:
            if event.id not in outcomes:
                continue  # not wanted: deleted unsent
            log.info(
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
            await anyio.to_thread.run_sync(store.event_failed, event.id, now() + delay, error)
            log.warning(
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


async def _send_all(
    sender: WebhookSender, batch: list[PendingEvent], now: Callable[[], datetime]
) -> dict[int, str | None]:
    """POST a batch (one event per user), `SENDERS` at a time; each event's error or None."""
    outcomes: dict[int, str | None] = {}
    limiter = anyio.CapacityLimiter(SENDERS)

    async def one(event: PendingEvent) -> None:
        async with limiter:
            outcomes[event.id] = await sender.send(event, now())

    async with anyio.create_task_group() as tg:
        for event in batch:
            tg.start_soon(one, event)
    return outcomes
