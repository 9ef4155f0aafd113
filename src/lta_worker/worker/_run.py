"""One pass with its jobs around it: the jobs before, the engine with the jobs alongside, the
jobs after (`_jobs`); what `run` calls once and `serve` every `poll.tick`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio

from lta_worker.worker import _jobs as jobs
from lta_worker.worker._budget_watch import BudgetWatch, make_plan
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassResult, ProgressFn, pass_options

if TYPE_CHECKING:
    from lta_worker.domain import Answer, Endpoint, Proof
    from lta_worker.secret import Secret
    from lta_worker.worker._runtime import Worker


async def run_pass(
    rt: Worker, *, max_duration: timedelta | None = None, on_progress: ProgressFn | None = None
) -> PassResult:
    """Pending drops, one pass over the due users, then its bookkeeping.

    Drops the service has not confirmed yet (users `dropping`, due for a retry) are sent
    again first, through the pacer, so they spend the same budget as the reads.
    """
    await jobs.refresh_share(rt)
    await jobs.follow_schedule(rt)
    await jobs.retry_drops(rt)
    watch = BudgetWatch(rt)
    engine = await _engine(rt, max_duration, on_progress, watch)
    if rt.stop_grace is not None:  # a stop came before the engine existed
        engine.request_stop("cancelled", rt.stop_grace)
    rt.current = engine
    started_at = rt.clock.now()
    error: Exception | None = None
    shared = rt.pacer.shared
    try:
        async with anyio.create_task_group() as alongside:
            alongside.start_soon(jobs.keep_alive, rt)
            alongside.start_soon(watch.run, engine)
            if shared is not None:
                alongside.start_soon(jobs.settle_shared, rt, shared)
            try:
                result = await engine.run()
            except Exception as exc:  # raised below, outside the task group
                error = exc
            alongside.cancel_scope.cancel()
    finally:
        rt.current = None
        if shared is not None:
            with anyio.CancelScope(shield=True):
                await shared.flush(release=True)
    if error is not None:
        raise error
    with anyio.CancelScope(shield=True):
        await jobs.after_pass(rt, result, started_at)
    # `run`: the pass's events go out before it exits (not shielded: a stop may cut the
    # delivery short). `serve` delivers from its own job: a slow receiver must never hold
    # the next pass, nor share the sender's connections with a second delivery.
    if rt.stop_grace is None and rt.kind != "serve":
        await jobs.deliver_webhooks(rt)
    return result


async def _engine(
    rt: Worker,
    max_duration: timedelta | None,
    on_progress: ProgressFn | None,
    watch: BudgetWatch,
) -> PassEngine:
    """The engine of one pass, over the runtime's collaborators and the freshness plan
    (made again when `watch` sees the budget move)."""
    plan = await make_plan(rt)
    # After the wait: a reload meanwhile is in force from the first turn (none can come
    # between here and `rt.current`, where a later one reaches the engine).
    options = pass_options(rt.settings, rt.instance, max_duration)
    options = replace(options, policy=replace(options.policy, plan=plan))
    return PassEngine(
        store=rt.store,
        vault=rt.vault,
        api=_ApiOnFirstRead(rt),
        pacer=rt.pacer if rt.metrics is None else rt.metrics.metered(rt.pacer),
        clock=rt.clock,
        options=options,
        rng=rt.rng,
        on_progress=on_progress,
        on_read=watch.on_read,
    )


class _ApiOnFirstRead:
    """The pass's reader: the runtime's API client, asked for at the first read (a pass
    with nobody due never builds it)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Worker) -> None:
        self._rt = rt

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        """`ApiClient.read`."""
        return await self._rt.api.read(endpoint, token)

    async def prove(self, proof: Proof) -> bool | None:
        """`ApiClient.client_accepted` or `ApiClient.read_path_found`."""
        api = self._rt.api
        return await (api.client_accepted() if proof == "client" else api.read_path_found())
