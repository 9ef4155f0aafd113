"""The pass's single writer: decisions committed in batches, fenced, then their events.

It commits what came in the last half second (at most `WRITE_BATCH` decisions) in one
transaction, on a worker thread. Fencing: every decision carries the generation its user
was claimed with, and the store writes it only while the row still has it (a lifecycle
command changed nothing since); otherwise it is discarded with a `poll.discarded` event. So
are the decisions of users whose write failed (the others of the batch are written; the
user stays due). Only a decision written logs its changes.
"""

from __future__ import annotations

from functools import partial
from typing import Final

import anyio
from anyio.abc import ObjectReceiveStream

from lta_worker.domain import UserRow, UserUpdate
from lta_worker.runtime import Clock
from lta_worker.worker import _pass_log as events
from lta_worker.worker._lease_book import Lease, LeaseBook
from lta_worker.worker._ports import PassStore

# The writer commits every WRITE_LINGER_S, or sooner at WRITE_BATCH decisions. A commit
# is a trip to the store's thread, which costs more than its statements: the thread runs
# on another core, whose caches hold none of it (pinned to one core, the cost was gone).
# At 50 decisions a commit B1's worker took 7 % more CPU per read than at 250. At usual
# budgets (a few reads a minute) a commit holds one decision, half a second after it.
WRITE_BATCH: Final = 250
WRITE_LINGER_S: Final = 0.5


class DecisionWriter:
    """Writes one pass's decisions; knows the rows of the users whose turn is not written."""

    def __init__(self, store: PassStore, instance: str, clock: Clock, leases: LeaseBook) -> None:
        self.store = store
        self.instance = instance
        self.clock = clock
        self.leases = leases
        self.pending: list[UserUpdate] = []
        # The rows of the turns not written yet, per lease (a user claimed again in one
        # pass has two): the name for `poll.discarded`, the state before for the events
        # of a decision written.
        self.claimed: dict[Lease, UserRow] = {}

    async def run(self, updates: ObjectReceiveStream[UserUpdate]) -> None:
        """Commit what comes, batch by batch, until the readers are done."""
        async with updates:
            closed = False
            while not closed:
                with anyio.move_on_after(WRITE_LINGER_S):
                    while len(self.pending) < WRITE_BATCH:
                        try:
                            self.pending.append(await updates.receive())
                        except anyio.EndOfStream:
                            closed = True
                            break
                await self.flush()

    async def flush(self) -> None:
        """Commit the pending decisions in one transaction, then log what it did."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        discarded: list[tuple[UserUpdate, str]] = []
        with anyio.CancelScope(shield=True):  # a batch is written whole or not at all
            apply = partial(
                self.store.apply,
                batch,
                owner=self.instance,
                now=self.clock.now(),
                discarded=discarded,
            )
            await anyio.to_thread.run_sync(apply)
        not_written = {id(update): reason for update, reason in discarded}
        for update in batch:  # a pass over a million users keeps only the unwritten rows
            lease = (update.user_id, update.generation)
            user = self.claimed.pop(lease, None)
            self.leases.forget(lease)
            reason = not_written.get(id(update))
            if reason is not None:
                # `changed`: a lifecycle command (enrollment, drop, forget) or another
                # instance changed the user since the claim, and wins. `failed`: the
                # database refused this user's write alone; it stays due. Neither says more
                # (no payload), nor logs the decision's state or token changes: they did
                # not happen.
                name = user.user if user is not None else str(update.user_id)
                events.discarded(name, reason, update.last_outcome)
            elif user is not None:
                # Only now that the write is committed are its changes true.
                events.changes(user, update)
