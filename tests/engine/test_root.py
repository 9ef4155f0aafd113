"""The composition root (`Runtime`, `Worker`): the client secret is read once, and only the API
client holds it; a running worker registers itself and, on SQLite, holds the file; SIGHUP's
reload applies what it can and names what needs a restart; the metrics at start."""

from __future__ import annotations

import inspect
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from lta_worker.config import Settings, read_client_secret
from lta_worker.domain import ENDPOINTS, OUTCOME_KINDS
from lta_worker.errors import InstanceLockedError, UnknownKeyError
from lta_worker.report import collect_status
from lta_worker.runtime import READERS
from lta_worker.secret import Secret
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET
from lta_worker.worker import PassEngine

from .conftest import Harness

pytestmark = pytest.mark.anyio


async def test_the_client_secret_file_is_read_once_per_start_and_once_per_reload(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`client.secret_file` is read once at start and once per reload, rebuilding the client."""
    await harness.enroll("alice")
    await harness.enroll("bob")
    reads: list[Settings] = []

    def counted(settings: Settings) -> Secret:
        reads.append(settings)
        return read_client_secret(settings)

    monkeypatch.setitem(READERS, "client_secret", counted)  # type: ignore[index]
    async with harness.worker() as worker:
        assert len(reads) == 1
        result = await worker.run_pass()
        assert result.reads > 0
        before = worker.api
        worker.reload(harness.settings())
        assert len(reads) == 2
        assert worker.api is not before  # built again, with what the reload read
    assert len(reads) == 2


async def test_the_pass_engine_never_holds_the_client_secret(harness: Harness) -> None:
    """Neither `PassEngine`'s arguments nor a running engine's attributes hold the secret."""
    assert [name for name in inspect.signature(PassEngine).parameters if "secret" in name] == []
    await harness.enroll("alice")
    engines: list[Any] = []
    async with harness.worker() as worker:
        result = await worker.run_pass(on_progress=engines.append)
    assert result.reads > 0 and engines
    for name, value in vars(engines[0]).items():
        if isinstance(value, Secret):
            assert DEMO_CLIENT_SECRET not in value.reveal(), name
        assert DEMO_CLIENT_SECRET not in repr(value), name


async def test_a_running_worker_is_listed_and_holds_the_sqlite_file(harness: Harness) -> None:
    """A running worker is listed by `status` (pid, kind) until it ends; on SQLite another `run`
    or `serve` on its file is refused (75), naming the file and the way to several instances."""
    async with harness.worker() as worker:
        listed = collect_status(harness.settings(), harness.clock.now())["instances"]
        assert [(i["instance"], i["pid"], i["kind"]) for i in listed] == [
            (worker.instance, os.getpid(), "run")
        ]
        for kind in ("run", "serve"):
            with pytest.raises(InstanceLockedError) as refused:
                async with harness.worker(kind=kind):
                    pass
            assert refused.value.exit_code == 75
            assert "is already working on" in str(refused.value)
            assert harness.db_url.removeprefix("sqlite:///") in str(refused.value)
            assert "need PostgreSQL" in (refused.value.hint or "")
    assert collect_status(harness.settings(), harness.clock.now())["instances"] == []


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


async def test_a_restarted_worker_reports_the_budget_and_every_read_series(
    harness: Harness, tmp_path: Path
) -> None:
    """Before any read: the budget gauges from the database, every reads series at 0."""
    h = harness  # a budget of 1,000,000 an hour: the pass is not paced (120 took 30 s)
    await h.enroll("ada")
    assert (await h.run_pass()).exit_code == 0
    with h.store() as store:
        seen = store.budget_seen(DEMO_CLIENT_ID)
    assert seen is not None and seen.remaining is not None and seen.remaining < 1_000_000
    h.configure("metrics", textfile=str(tmp_path / "lta_worker.prom"))
    worker = h.worker()
    async with worker:
        assert worker.metrics is not None
        value = worker.metrics.registry.get_sample_value
        assert value("lta_worker_budget_limit") == 1_000_000
        assert value("lta_worker_budget_remaining") == seen.remaining
        for endpoint in ENDPOINTS:
            for outcome in OUTCOME_KINDS:
                labels = {"endpoint": endpoint, "outcome": outcome}
                assert value("lta_worker_reads_total", labels) == 0, labels
