"""`python -m lta_worker` runs the CLI."""

from __future__ import annotations

from lta_worker.cli import main

main()
