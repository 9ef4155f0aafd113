"""The composition root (`Runtime`): the client secret is read once, and only the API client
holds it; a running worker registers itself and, on SQLite, holds the file."""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest

from lta_worker.config import Settings, read_client_secret
from lta_worker.errors import InstanceLockedError
from lta_worker.report import collect_status
from lta_worker.runtime import READERS
from lta_worker.secret import Secret
from lta_worker.simulator import DEMO_CLIENT_SECRET
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
