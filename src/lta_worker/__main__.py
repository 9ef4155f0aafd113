"""`python -m lta_worker` and the `lta-worker` console script: the CLI, SIGHUP held first.

`serve` reloads on SIGHUP, and one sent while it starts would end it by the default action;
blocked here, the kernel keeps it pending until `serve`'s handler is in place (every other
command unblocks it as it is dispatched, so that a hang-up ends them as before).
"""

from __future__ import annotations

import signal


def main() -> None:
    """Hold SIGHUP, then run the CLI (`lta_worker.cli.main`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    from lta_worker.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
