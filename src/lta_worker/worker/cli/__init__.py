"""The command line interface (placeholder until the CLI lands)."""

from __future__ import annotations


def main() -> None:
    """Entry point of the `lta-worker` console script."""
    raise SystemExit(0)
