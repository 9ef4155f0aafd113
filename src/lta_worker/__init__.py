"""lta-worker: the client-side worker for the Long Term Access interface.

Packages:
    config     typed, frozen settings from TOML, environment and secret files
    storage    models, migrations, the token vault and the queries
    worker     API client, classification, policy, pacing, the pass engine, CLI
    simulator  a faithful local stand-in for the remote service
"""

from __future__ import annotations

__version__ = "0.1.0"
