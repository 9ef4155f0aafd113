"""How a pass stops: why, claiming ends at once, turns waiting for a pacer permit give up.

A stop (the deadline, the service seeming down, SIGTERM in `serve`) lets reads already sent
finish and cancels the readers still reading after the grace period; a reader still waiting
for a permit gives its turn up at once, so a tight budget never holds a stop for the whole
grace period. An abort (the breaker, a key id the key file lacks) cancels the pass at once.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup

from lta_worker.domain import StopReason
from lta_worker.pacing import PacerLike, Permit
from lta_worker.runtime import Clock


class Interrupted(Exception):
    """A turn given up because the pass stopped while it waited for a permit."""


class LeaseLapsed(Interrupted):
    """A turn given up because its user's lease may lapse before a read would end."""


class PassStop:
    """One pass's stop: its reason (the first one asked) and what it cancels."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.reason: StopReason | None = None
        self.requested = anyio.Event()
        self.scope: anyio.CancelScope | None = None  # the pass's, while it runs
        self.tasks: TaskGroup | None = None  # the pass's tasks, while they take new ones
        self._permit_waits: set[anyio.CancelScope] = set()

    def request(self, reason: StopReason, grace: float) -> None:
        """Stop claiming; readers finish the users they hold, and are cancelled after `grace`.

        Readers still waiting for a permit give their users up at once (they stay due).
        """
        if self.reason is None:
            self.reason = reason
        self.requested.set()
        for scope in self._permit_waits:
            scope.cancel()
        if self.tasks is not None and grace >= 0:
            self.tasks.start_soon(self._cancel_after, grace)

    def abort(self, reason: StopReason) -> None:
        """Stop at once, dropping what is in flight (breaker, fatal configuration error)."""
        self.reason = reason
        self.requested.set()
        if self.scope is not None:
            self.scope.cancel()

    async def _cancel_after(self, grace: float) -> None:
        await self.clock.sleep(grace)
        if self.scope is not None:
            self.scope.cancel()

    async def permit(self, pacer: PacerLike) -> Permit:
        """Wait for a pacer permit; raise `Interrupted` when the pass stops meanwhile."""
        if self.requested.is_set():
            raise Interrupted
        permit: Permit | None = None
        with anyio.CancelScope() as scope:
            self._permit_waits.add(scope)
            try:
                permit = await pacer.acquire()  # cancelled while waiting: nothing taken
            finally:
                self._permit_waits.discard(scope)
        if scope.cancelled_caught:
            raise Interrupted
        if permit is None:  # a broken pacer (or wrapper) must fail loudly, not skip users
            raise TypeError("the pacer's acquire() returned no Permit")
        return permit
