"""Run the lta-worker CLI with its clock stepped: `python -m bench.skewed SECONDS ARGS...`.

The worker reads wall time only through its injected clock (`lta_worker.worker.SystemClock`):
this launcher moves that clock's `now` by SECONDS (negative: behind) before the CLI starts,
so the process behaves as on a host whose clock is that far off. Nothing in the product
changes; monotonic time and sleeps stay real. The B6 soak starts one `serve` this way.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta


def main(argv: list[str]) -> None:
    """Step the clock by argv[0] seconds, then run the CLI with the rest."""
    offset = timedelta(seconds=float(argv[0]))

    from lta_worker.runtime import SystemClock

    real = SystemClock.now

    def stepped(self: SystemClock) -> datetime:
        return real(self) + offset

    SystemClock.now = stepped  # type: ignore[method-assign]
    sys.argv = ["lta-worker", *argv[1:]]

    from lta_worker.__main__ import main as cli

    cli()


if __name__ == "__main__":
    main(sys.argv[1:])
