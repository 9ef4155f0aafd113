"""The worker's Prometheus metrics (docs/operations.md, *Metrics and health*). Every series
exists from the start, and the timestamps and budget start from the database, so a restart
never reports "never succeeded" nor a budget of 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from lta_worker import __version__
from lta_worker.domain import ENDPOINTS, EXIT_CODES, OUTCOME_KINDS, USER_STATES, answered_reads

if TYPE_CHECKING:
    from lta_worker.domain import BudgetSeen, SchedulePlan
    from lta_worker.pacing import PacerLike, PacerSnapshot, Permit
    from lta_worker.storage import Store
    from lta_worker.worker._pass import PassResult

_PASS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3000, 3600, float("inf"))
_WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 900, float("inf"))


class Metrics:
    """The worker's metrics in their own registry (never the process-global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        self.reads = counter(
            "lta_worker_reads", "Reads of an endpoint by outcome.", ["endpoint", "outcome"]
        )
        self.read_duration = histogram(
            "lta_worker_read_duration_seconds", "Duration of one read.", ["endpoint"]
        )
        self.users = gauge("lta_worker_users", "Users by state.", ["state"])
        self.due = gauge("lta_worker_users_due", "Users due for a read.")
        self.pending_drops = gauge(
            "lta_worker_pending_drops", "Users whose drop the service has not confirmed."
        )
        self.webhook_backlog = gauge(
            "lta_worker_webhook_backlog", "Webhook events waiting for delivery."
        )
        self.webhook_dead = gauge(
            "lta_worker_webhook_dead_letters", "Webhook events dead-lettered after webhook.max_age."
        )
        self.budget_remaining = gauge(
            "lta_worker_budget_remaining",
            "Requests left in the rate limit window (the pacer's estimate).",
        )
        self.budget_limit = gauge("lta_worker_budget_limit", "The rate limit window's limit.")
        # Unknown (NaN) until a budget is seen: a reported limit of 0 is then told from none.
        self.budget_remaining.set(math.nan)
        self.budget_limit.set(math.nan)
        self.pacer_wait = histogram(
            "lta_worker_pacer_wait_seconds",
            "Time a read waited for a pacer permit.",
            buckets=_WAIT_BUCKETS,
        )
        self.pass_duration = histogram(
            "lta_worker_pass_duration_seconds", "Wall time of a pass.", buckets=_PASS_BUCKETS
        )
        self.passes = counter("lta_worker_passes", "Passes by how they stopped.", ["stopped"])
        self.last_pass_end = gauge(
            "lta_worker_last_pass_end_timestamp_seconds", "When the last pass ended (Unix time)."
        )
        self.last_success = gauge(
            "lta_worker_last_pass_success_timestamp_seconds",
            "When the last pass with a read the service answered ended (Unix time).",
        )
        self.breaker_trips = counter(
            "lta_worker_breaker_trips", "Passes stopped by the circuit breaker."
        )
        self.last_trip = gauge(
            "lta_worker_breaker_last_trip_timestamp_seconds",
            "When the last pass stopped by the circuit breaker ended (Unix time; 0: none).",
        )
        self.expected_delay = gauge(
            "lta_worker_schedule_expected_delay_seconds",
            "Adaptive schedule: the mean delay the plan expects from a change to its arrival.",
        )
        self.expected_delay.set(math.nan)  # unknown (NaN) until an adaptive plan says
        gauge("lta_worker_build_info", "The running version.", ["version"]).labels(
            version=__version__
        ).set(1)
        # Every label value, so each series exists from the start (the Prometheus client's
        # advice): `rate()` and absence alerts then work from the first scrape.
        for stopped in EXIT_CODES:
            self.passes.labels(stopped=stopped)
        for state in USER_STATES:  # 0 until the database is read
            self.users.labels(state=state)
        for endpoint in ENDPOINTS:
            self.read_duration.labels(endpoint=endpoint)
            for outcome in OUTCOME_KINDS:
                self.reads.labels(endpoint=endpoint, outcome=outcome)

    def on_read(self, endpoint: str, outcome: str, duration_s: float) -> None:
        """The engine's read observer: one read of `endpoint` ended with `outcome`."""
        self.reads.labels(endpoint=endpoint, outcome=outcome).inc()
        self.read_duration.labels(endpoint=endpoint).observe(duration_s)

    def on_plan(self, plan: SchedulePlan) -> None:
        """The plan a pass schedules with: its expected delay, or NaN when it has none."""
        delay = plan.expected_delay_s
        self.expected_delay.set(math.nan if delay is None else delay)

    def on_budget_seen(self, seen: BudgetSeen | None, now: datetime) -> None:
        """The budget the database recorded (at start): its limit and what is left."""
        if seen is None or seen.limit is None:
            return
        self.budget_limit.set(seen.limit)
        reset = seen.reset_at is not None and seen.reset_at <= now
        remaining = seen.limit if reset else seen.remaining
        if remaining is not None:
            self.budget_remaining.set(remaining)

    def on_pass(self, result: PassResult, finished_at: datetime) -> None:
        """A pass ended."""
        self.pass_duration.observe(result.wall_s)
        self.passes.labels(stopped=result.stopped).inc()
        self.last_pass_end.set(finished_at.timestamp())
        if answered_reads(result.counts, result.stopped):  # one that read nobody proves nothing
            self.last_success.set(finished_at.timestamp())
        if result.stopped == "breaker":
            self.breaker_trips.inc()
            self.last_trip.set(finished_at.timestamp())

    def on_store(self, store: Store, now: datetime, *, history: bool = False) -> None:
        """The database's figures; with `history` (at start), the last passes' timestamps too."""
        counts: Mapping[str, int] = store.count_by_state()
        for state, count in counts.items():
            self.users.labels(state=state).set(count)
        self.pending_drops.set(counts.get("dropping", 0))
        self.due.set(store.count_due(now))
        outbox = store.outbox_counts()
        self.webhook_backlog.set(outbox.backlog)
        self.webhook_dead.set(outbox.dead)
        if not history:
            return
        for gauge, last in (
            (self.last_pass_end, store.last_pass()),
            (self.last_success, store.last_pass(answered=True)),
            (self.last_trip, store.last_pass(stopped="breaker")),
        ):
            if last is not None:
                gauge.set(last.finished_at.timestamp())

    def resume_counters(self, path: Path) -> None:
        """Continue the counters from the textfile the last `run` wrote at `path`: rewritten
        from 0 by each run, a counter would never grow for `increase()`."""
        counters = (self.reads, self.passes, self.breaker_trips)
        by_name = {next(iter(counter.describe())).name: counter for counter in counters}
        try:
            families = list(text_string_to_metric_families(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, UnicodeDecodeError):
            return
        for family in families:
            counter = by_name.get(family.name)
            if counter is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value > 0:
                    target = counter.labels(**sample.labels) if sample.labels else counter
                    target.inc(sample.value)

    def write_textfile(self, path: Path) -> None:
        """Write every metric to `path` atomically (a temporary file renamed over it)."""
        write_to_textfile(str(path), self.registry)

    def metered(self, pacer: PacerLike) -> MeteredPacer:
        """`pacer`, with the time each permit took counted."""
        return MeteredPacer(pacer, self)


class MeteredPacer:
    """A pacer that times each `acquire` into `lta_worker_pacer_wait_seconds`."""

    def __init__(self, pacer: PacerLike, metrics: Metrics) -> None:
        self._pacer = pacer
        self._metrics = metrics

    async def acquire(self) -> Permit:
        """Wait for a permit (see the pacer), timing the wait."""
        started = time.monotonic()
        permit = await self._pacer.acquire()
        self._metrics.pacer_wait.observe(time.monotonic() - started)
        return permit

    def feed(
        self,
        permit: Permit | None,
        headers: Mapping[str, str],
        status: int | None,
        *,
        elapsed: float | None = None,
    ) -> None:
        """Feed an answer to the pacer, then take its budget figures (the known ones)."""
        self._pacer.feed(permit, headers, status, elapsed=elapsed)
        snapshot = self._pacer.snapshot()
        if snapshot.remaining is not None:
            self._metrics.budget_remaining.set(snapshot.remaining)
        if snapshot.limit is not None:
            self._metrics.budget_limit.set(snapshot.limit)

    def snapshot(self) -> PacerSnapshot:
        """What the wrapped pacer knows now."""
        return self._pacer.snapshot()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pacer, name)
