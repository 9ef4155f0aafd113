"""A throwaway PostgreSQL database for the tests of several instances on one database."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lta_worker.storage import Store
from support.pg import PG_ENV, PG_SKIP, throwaway_database


@pytest.fixture
def pg_url() -> Iterator[str]:
    """An empty, migrated PostgreSQL database of its own; skipped without a server."""
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(PG_SKIP)
    with throwaway_database(admin) as url:
        with Store.open(url) as store:
            store.upgrade()
        yield url
