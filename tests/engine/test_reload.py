"""SIGHUP's reload (`Worker.reload`): what it applies, and what it reports as needing a restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from lta_worker.errors import UnknownKeyError

from .conftest import Harness

pytestmark = pytest.mark.anyio

# A change to each section set up at start: the store, the HTTP client, the webhook
# sender, the enrollment listener and the metrics.
RESTART_ONLY: list[tuple[str, dict[str, Any]]] = [
    ("service", {"request_timeout": "7s"}),
    ("webhook", {"url": "https://hook.example/x"}),
    ("enroll", {"return_url": "https://app.example/done"}),
    ("metrics", {"textfile": "/tmp/lta-metrics.prom"}),
]


@pytest.mark.parametrize(("section", "values"), RESTART_ONLY, ids=[s for s, _ in RESTART_ONLY])
async def test_a_section_set_up_at_start_keeps_its_running_value_and_says_so(
    harness: Harness, section: str, values: dict[str, Any]
) -> None:
    """A restart-only section keeps its running value and warns naming it; `poll` applies."""
    settings = harness.settings()
    async with harness.worker() as worker:
        harness.configure(section, **values)  # validated as the loader does
        new = harness.settings()
        assert getattr(new, section) != getattr(settings, section)
        new = replace(new, poll=replace(new.poll, tick=timedelta(seconds=42)))
        with capture_logs() as logs:
            worker.reload(new)
        assert getattr(worker.settings, section) == getattr(settings, section)
        assert worker.settings.poll.tick == timedelta(seconds=42)
    warnings = [e for e in logs if e["event"] == "service.reload_partial"]
    assert [e["needs_restart"] for e in warnings] == [[section]]


async def test_a_key_file_without_a_key_in_use_is_refused_whole(harness: Harness) -> None:
    """A key file lacking a key id in use: UnknownKeyError, and nothing in force changes."""
    settings = harness.settings()
    async with harness.worker() as worker:
        vault, secret = worker.vault, worker.secret("client_secret")
        new = replace(settings, poll=replace(settings.poll, tick=timedelta(seconds=42)))
        with pytest.raises(UnknownKeyError) as raised:
            worker.reload(new, key_ids_in_use=[*vault.key_ids, "gone-2024"])
        assert raised.value.key_id == "gone-2024"
        in_force = (worker.vault, worker.secret("client_secret"), worker.settings)
        assert in_force == (vault, secret, settings)
        worker.reload(new, key_ids_in_use=vault.key_ids)  # every id listed: taken
        assert worker.settings == new
