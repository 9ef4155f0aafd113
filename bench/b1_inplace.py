"""B1's worker pass with one part taken out at a time: what each part costs in place.

The turn costs (`b1_breakdown`) time each step alone, on a quiet core with warm caches. In a
real pass the same steps cost two to five times more: they share the core's caches with the
HTTP client and the event loop. So here the
real pass of B1 (`b1_overhead.worker_pass`, same simulator process, same users) runs as it
is and with one part removed, the rounds interleaved:

- **store writes**: `Store.apply` writes nothing (the claims still lease the users);
- **the `poll.read` line**: the per-read log line is not rendered;
- **the pacer**: every permit at once, nothing learned from the answers;
- **all three** at once.

And one what-if the other way: **the store's calls on a worker thread**, each call handed
to a thread as the engine did before it made them on the loop's thread (SQLite); its
figure is what the pass would cost more that way.

A part's cost in place is the CPU per read of the pass as it is, less that of the pass
without the part (for the what-if: the pass with it, less the pass as it is). These are
patches of the package's internals for the run, restored after it; none of them is a
setting, and the passes without a part are not correct passes (no results are kept, the
budget is not respected).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from bench.common import log, make_all_due, median, quiet_logs

Patch = Callable[[], Any]  # a context manager factory


@contextmanager
def _attr(owner: Any, name: str, value: Any) -> Iterator[None]:
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, previous)


def _store_on_thread() -> Any:
    from lta_worker.worker._engine import PassEngine

    async def on_thread(self: Any, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args))

    return _attr(PassEngine, "_db", on_thread)


def _no_store_writes() -> Any:
    from lta_worker.storage import Store

    def apply(self: Any, updates: Sequence[Any], **_: Any) -> int:
        return 0

    return _attr(Store, "apply", apply)


def _no_read_line() -> Any:
    from lta_worker.worker import _pass_log

    return _attr(_pass_log, "read", lambda *args, **kwargs: None)


@contextmanager
def _no_pacer() -> Iterator[None]:
    from lta_worker.pacing import Pacer, Permit

    async def acquire(self: Any) -> Any:
        return Permit(sent_at=time.monotonic())

    with _attr(Pacer, "acquire", acquire), _attr(Pacer, "feed", lambda *args, **kw: None):
        yield


# What each part costs, and how it is taken out (see the module's docstring).
PARTS: dict[str, tuple[Patch, ...]] = {
    "store writes (apply)": (_no_store_writes,),
    "the poll.read line": (_no_read_line,),
    "the pacer": (_no_pacer,),
    "all three": (_no_store_writes, _no_read_line, _no_pacer),
}
# What a pass would cost more with a patch (see the module).
WHAT_IFS: dict[str, tuple[Patch, ...]] = {
    "the store's calls on a worker thread": (_store_on_thread,),
}


def measure(
    settings: Any, tokens: Sequence[tuple[str, str]], db_path: Path, rounds: int
) -> dict[str, Any]:
    """CPU per read of the pass as is and without each part (medians of `rounds`)."""
    from bench.b1_overhead import worker_pass

    patches = {**PARTS, **WHAT_IFS}
    cpu: dict[str, list[float]] = {name: [] for name in ("as is", *patches)}
    for i in range(rounds):
        for name, values in cpu.items():
            make_all_due(db_path)
            with ExitStack() as stack:
                for patch in patches.get(name, ()):
                    stack.enter_context(patch())
                with quiet_logs("info"):
                    timing = anyio.run(worker_pass, settings, tokens)
            values.append(1000 * timing.cpu_s / timing.reads)
        log(f"B1 in place round {i + 1}/{rounds}: as is {cpu['as is'][-1]:.3f} ms per read")
    as_is = median(cpu["as is"])
    return {
        "cpu_ms_per_read": {name: round(median(values), 3) for name, values in cpu.items()},
        "rounds_ms_per_read": {name: [round(v, 3) for v in values] for name, values in cpu.items()},
        "cost_in_place_ms_per_read": {
            name: round(as_is - median(values), 3) for name, values in cpu.items() if name in PARTS
        },
        "what_if_more_ms_per_read": {
            name: round(median(values) - as_is, 3)
            for name, values in cpu.items()
            if name in WHAT_IFS
        },
    }
