"""lta-worker: the client-side worker for the Long Term Access interface.

Packages, top down (each imports only the ones below it, through their faces):
    cli         the `lta-worker` command line
    worker      the pass engine, the `Worker` of `run` and `serve`, `check`
    enrollment  enrollment and the end of access, as a Python API and an ASGI app
    report      `status`, health and the freshness plan, read from the database
    upstream    the service's HTTP interface (httpx)
    pacing      the shared hourly budget, spent evenly
    storage     the database, its migrations and the token vault
    config      typed, frozen settings from TOML, environment and secret files
    domain      the service's rules as data: pure, no I/O
    simulator   a faithful local stand-in for the remote service (imports none of the above)

Modules below them: `logs`, `secret_file`, `protocol`, `secret`, `errors`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
]
