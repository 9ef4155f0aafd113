"""`python -m lta_worker` and the `lta-worker` console script: the CLI, SIGHUP held first.

SIGHUP is blocked before anything else is imported: `serve` reloads on it, and one sent
while it starts (the imports, the settings, the database: seconds on a loaded machine)
would otherwise end it by the signal's default action. The kernel keeps one pending;
`serve` lets it through once its handler is in place (one reload right after start), and
every other command as it is dispatched, so that a hang-up ends them as before. Only the
interpreter's own start, before this module runs, is out of reach.
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
