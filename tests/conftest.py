"""Session-wide test setup: logs rendered as JSON into a buffer, reset after every test."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from hypothesis import settings

from lta_worker.logs import configure_logging, forget_secrets, reset_logging

# Time is measured in bench/, never in tests: Hypothesis' default deadline (200 ms an
# example) fails a property on a slow or busy machine with nothing wrong in the code.
# A migrated `store` over every backend (SQLite, and PostgreSQL when configured), for the
# storage tests and the commands' tests that read or write a database.
pytest_plugins = ["support.backends"]

settings.register_profile("lta", deadline=None)
settings.load_profile("lta")


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the worker's loop), not on every backend anyio finds."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _quiet_json_logs() -> Iterator[io.StringIO]:
    """Render logs the way production does (JSON, redaction on) without printing them."""
    stream = io.StringIO()
    configure_logging("debug", "json", stream)
    yield stream
    reset_logging()
    forget_secrets()


@pytest.fixture
def rendered_logs(_quiet_json_logs: io.StringIO) -> io.StringIO:
    """What the test's logs rendered so far (JSON, redaction on)."""
    return _quiet_json_logs
