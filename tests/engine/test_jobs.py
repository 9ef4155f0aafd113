"""The periodic jobs (`_jobs`), each run alone on a real runtime over virtual time."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from lta_worker.runtime import instance_ttl
from lta_worker.storage import generate_key_line
from lta_worker.worker import PassResult, Worker
from lta_worker.worker import _jobs as jobs
from support.virtual_time import autojump

from .conftest import Harness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def runtime(h: Harness, **kwargs: Any) -> AsyncIterator[Worker]:
    """An open runtime on the harness's virtual clock, inside `autojump`."""
    async with autojump():
        worker = h.worker(**kwargs)
        async with worker as rt:
            yield rt


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_keep_alive_beats_and_the_share_follows_the_live_instances(
    virtual_harness: Harness,
) -> None:
    """Each heartbeat during a pass marks the instance alive and sets the share (1/2 of two);
    another silent for longer than four heartbeats no longer counts (1)."""
    h = virtual_harness
    async with runtime(h) as rt:
        start = rt.clock.now()
        await anyio.to_thread.run_sync(rt.store.register_instance, "other", "serve", start)
        async with anyio.create_task_group() as tg:
            tg.start_soon(jobs.keep_alive, rt)
            await rt.clock.sleep(75)
            tg.cancel_scope.cancel()
        live = {
            row.instance: row for row in rt.store.live_instances(rt.clock.now(), timedelta(hours=2))
        }
        assert live[rt.instance].heartbeat_at == start + timedelta(seconds=60)
        assert rt.pacer.core.share == 0.5
        await rt.clock.sleep(instance_ttl(rt.settings).total_seconds() + 1)
        await jobs.heartbeat(rt)
        await jobs.refresh_share(rt)
        assert rt.pacer.core.share == 1.0


async def test_a_heartbeat_registers_again_an_instance_pruned_meanwhile(
    virtual_harness: Harness,
) -> None:
    """An instance pruned by another registers again at its next heartbeat."""
    h = virtual_harness
    async with runtime(h) as rt:
        await rt.clock.sleep(10)
        assert rt.store.prune_instances(rt.clock.now(), timedelta(0)) == 1
        await jobs.heartbeat(rt)
        live = rt.store.live_instances(rt.clock.now(), timedelta(seconds=1))
        assert [row.instance for row in live] == [rt.instance]


async def test_follow_schedule_moves_users_when_the_interval_changed(
    virtual_harness: Harness,
) -> None:
    """A new `poll.interval` reschedules once (`schedule.followed`); the same again does nothing."""
    h = virtual_harness
    async with autojump():
        await h.enroll("alice")
    async with runtime(h) as rt:
        await jobs.follow_schedule(rt)
    h.configure("poll", interval="2h")
    async with runtime(h) as rt:
        with capture_logs() as logs:
            moved = await jobs.follow_schedule(rt)
            again = await jobs.follow_schedule(rt)
    assert moved is not None and again is None
    (followed,) = events(logs, "schedule.followed")
    assert followed["interval_s"] == 7200


async def test_after_pass_records_the_pass_and_writes_the_metrics_textfile(
    virtual_harness: Harness, tmp_path: Any
) -> None:
    """After a pass: its record (finished now), then the purge, then the metrics textfile."""
    h = virtual_harness
    textfile = tmp_path / "lta.prom"
    h.configure("metrics", textfile=str(textfile))
    async with runtime(h) as rt:
        started = rt.clock.now()
        await rt.clock.sleep(5)
        result = PassResult(stopped="completed", exit_code=0, reads=3)
        await jobs.after_pass(rt, result, started)
        record = rt.store.last_pass()
        assert record is not None
        assert (record.instance, record.reads) == (rt.instance, 3)
        assert record.finished_at - record.started_at == timedelta(seconds=5)
    assert "lta_worker_" in textfile.read_text()


async def test_a_metrics_textfile_that_cannot_be_written_is_logged(
    virtual_harness: Harness, tmp_path: Any
) -> None:
    """An unwritable textfile: `metrics.write_failed`, and the job ends normally."""
    h = virtual_harness
    h.configure("metrics", textfile=str(tmp_path / "missing" / "lta.prom"))
    async with runtime(h) as rt:
        with capture_logs() as logs:
            result = PassResult(stopped="completed", exit_code=0)
            await jobs.update_metrics(rt, result, rt.clock.now())
    (failed,) = events(logs, "metrics.write_failed")
    assert "hint" in failed


async def test_maintain_purges_checkpoints_and_reports(virtual_harness: Harness) -> None:
    """The maintenance job: `maintenance.finished` with the users purged and the checkpoint."""
    async with runtime(virtual_harness) as rt:
        with capture_logs() as logs:
            purged = await jobs.maintain(rt)
    (finished,) = events(logs, "maintenance.finished")
    assert finished == {
        "event": "maintenance.finished",
        "_logger": "lta_worker.service",
        "log_level": "info",
        "instance": rt.instance,
        "purged_users": purged.users,
        "checkpoint": True,
    }


async def test_report_heartbeat_counts_the_users_due_and_by_state(
    virtual_harness: Harness,
) -> None:
    """`service.heartbeat`: the users due now and the users in each state."""
    h = virtual_harness
    async with autojump():
        await h.enroll("alice")
        await h.enroll("bob")
    async with runtime(h) as rt:
        with capture_logs() as logs:
            await jobs.report_heartbeat(rt)
    (beat,) = events(logs, "service.heartbeat")
    assert {k: beat[k] for k in ("due", "active", "parked", "unlinked", "rejected")} == {
        "due": 2,
        "active": 2,
        "parked": 0,
        "unlinked": 0,
        "rejected": 0,
    }


async def test_with_nothing_to_send_delivery_and_drop_retries_send_nothing(
    virtual_harness: Harness,
) -> None:
    """No `webhook.url`, nobody `dropping`: those jobs send nothing, build no API client."""
    h = virtual_harness
    async with runtime(h) as rt:
        done = await jobs.deliver_webhooks(rt)
        retries = await jobs.retry_drops(rt)
    assert (done.delivered, done.failed, done.dead) == (0, 0, 0)
    assert (retries.confirmed, retries.pending, retries.interrupted) == (0, 0, 0)
    assert h.sim.requests() == []


async def test_a_lost_key_file_is_logged_once_and_its_return_too(
    virtual_harness: Harness,
) -> None:
    """A deleted key file: `key_file_lost` once, health marked; restored: `key_file_back`."""
    h = virtual_harness
    saved = h.key_file.read_bytes()
    async with runtime(h) as rt:
        with capture_logs() as logs:
            h.key_file.unlink()
            await jobs.check_key_file(rt)
            await jobs.check_key_file(rt)
            assert rt.problems() != []
            h.key_file.write_bytes(saved)
            h.key_file.chmod(0o600)
            await jobs.check_key_file(rt)
            assert rt.problems() == []
    names = [e["event"] for e in logs]
    assert names.count("service.key_file_lost") == 1
    assert names.count("service.key_file_back") == 1


def _new_key_file(line: str) -> str:
    """A key file from `keys generate` now: another key id."""
    return generate_key_line(datetime.now(UTC)) + "\n"


def _same_id_other_key(line: str) -> str:
    """The key id in force, another key under it (an edit, a copy from the wrong host)."""
    key_id = line.split(":", 1)[0]
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}\n"


@pytest.mark.parametrize("replace", [_new_key_file, _same_id_other_key], ids=["new-id", "same-id"])
async def test_a_replaced_key_file_is_lost_naming_the_key_id(
    virtual_harness: Harness, replace: Any
) -> None:
    """A key file that cannot decrypt is lost, naming the key id in force (never the key)."""
    h = virtual_harness
    line = h.key_file.read_text(encoding="utf-8").strip()
    async with runtime(h) as rt:
        key_id = rt.vault.current_key_id
        with capture_logs() as logs:
            h.key_file.write_text(replace(line), encoding="utf-8")
            h.key_file.chmod(0o600)
            await jobs.check_key_file(rt)
            assert rt.problems() != []
    (lost,) = events(logs, "service.key_file_lost")
    assert repr(key_id) in lost["message"]
    assert line.split(":", 1)[1] not in repr(logs)
