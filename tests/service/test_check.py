"""`lta-worker check` through the CLI against the served simulator (an unreachable service:
test_exit_codes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from lta_worker.storage import generate_key_line
from support.process import Workspace, reads, write_private

from .conftest import listen_for_enrollment


def _check(world: Workspace) -> tuple[int, dict[str, Any]]:
    done = world.here("check", "--format", "json")
    return done.returncode, json.loads(done.stdout)


def _client_reads(world: Workspace) -> int:
    """Reads the simulator counted against the client (with a credential)."""
    return sum(1 for e in reads(world.sim) if e.client is not None)


def test_check_passes_and_spends_no_read(world: Workspace) -> None:
    """All checks ok: exit 0, no read spent, nothing written, the table says `ok` per check."""
    world.enroll(["ada"])
    before, database = _client_reads(world), world.database.read_bytes()
    code, data = _check(world)
    assert code == 0, data
    assert data["ok"] is True
    assert [c["name"] for c in data["checks"]] == [
        "config",
        "client_secret",
        "key_file",
        "database",
        "service",
    ]
    assert all(c["ok"] for c in data["checks"])
    assert _client_reads(world) == before
    table = world.here("check")
    assert table.returncode == 0
    assert all(line.startswith("ok ") for line in table.stdout.splitlines())
    assert world.database.read_bytes() == database  # nothing written
    assert not (world.tmp / "lta.db-wal").exists()


def test_check_key_file_with_the_right_ids_but_other_keys_is_78(world: Workspace) -> None:
    """Right key ids, wrong keys: key_file check fails 78, nothing changes, no key shown."""
    world.enroll(["ada"])
    key_id, material = world.key_file.read_text().strip().split(":", 1)
    other = generate_key_line(datetime.now(UTC)).split(":", 1)[1]
    write_private(world.key_file, f"{key_id}:{other}\n")
    before = world.database.read_bytes()
    code, data = _check(world)
    assert code == 78, data
    failed = {c["name"]: c for c in data["checks"] if not c["ok"]}
    assert list(failed) == ["key_file"]
    assert failed["key_file"]["message"].startswith("crypto.key_file: ")
    assert key_id in failed["key_file"]["message"]
    assert material not in json.dumps(data)
    assert world.database.read_bytes() == before


def test_check_wrong_base_url_path_is_78(world: Workspace) -> None:
    """A wrong base_url path (404 unauthenticated): 78 naming service.base_url, no read spent."""
    world.enroll(["ada"])
    base = world.running.base_url
    world.write_config(world.config_text().replace(base, base + "/v2"))
    before = _client_reads(world)
    code, data = _check(world)
    assert code == 78, data
    service = data["checks"][-1]
    assert (service["name"], service["ok"], service["exit_code"]) == ("service", False, 78)
    assert service["message"].startswith("service.base_url: ")
    assert "404" in service["message"]
    assert _client_reads(world) == before


def webhook_secret(mode: int | None) -> Callable[[Workspace], None]:
    """`webhook.url` set, its secret file at `mode` (None: no such file)."""

    def setup(world: Workspace) -> None:
        secret = "whsec_c2VydmUtd2ViaG9vay1zZWNyZXQtb2YtMzItYnl0ZXM=\n"  # 32 bytes: valid
        path = write_private(world.tmp / "webhook-secret", secret)
        if mode is None:
            path.unlink()
        else:
            path.chmod(mode)
        world.extra = f'[webhook]\nurl = "http://127.0.0.1:9/hook"\nsecret_file = "{path}"\n'
        world.write_config()

    return setup


def link_key_open(world: Workspace) -> None:
    listen_for_enrollment(world)
    (world.tmp / "enroll-link-key").chmod(0o644)


@pytest.mark.parametrize(
    ("setup", "key"),
    [
        (lambda world: world.secret_file.chmod(0o644), "client.secret_file"),
        (webhook_secret(0o644), "webhook.secret_file"),
        (webhook_secret(None), "webhook.secret_file"),
        (link_key_open, "enroll.link_key_file"),
    ],
    ids=["client-secret-0644", "webhook-secret-0644", "webhook-secret-missing", "link-key-0644"],
)
def test_check_fails_where_serve_fails(world: Workspace, setup: Any, key: str) -> None:
    """A secret file `serve` refuses at start (the webhook secret with `webhook.url` set, the
    link key with `enroll.listen` set): `check` exits 78 naming the same key, as `serve` does;
    its table says FAIL for that check alone (the others ran), its `error` event names the key."""
    world.enroll(["ada"])
    setup(world)
    code, data = _check(world)
    assert code == 78, data
    failed = [c for c in data["checks"] if not c["ok"]]
    assert [c["exit_code"] for c in failed] == [78]
    assert failed[0]["message"].startswith(f"{key}: ")
    table = world.here("check")
    assert [line.split()[:2] for line in table.stdout.splitlines() if line.startswith("FAIL")] == [
        ["FAIL", failed[0]["name"]]
    ]
    assert (table.events[-1]["event"], table.events[-1]["key"]) == ("error", key)
    served = world.here("serve")
    assert served.returncode == 78
    assert served.events[-1]["key"] == key


def test_check_fails_where_serve_lacks_the_web_extra(
    world: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`enroll.listen` set without the `[web]` extra (here: a module that is not there):
    `check` exits 78 naming `enroll.listen`, as `serve` would at start."""
    from click.testing import CliRunner

    from lta_worker.cli import _app, cli

    world.enroll(["ada"])
    link_key_open(world)
    world.tmp.joinpath("enroll-link-key").chmod(0o600)
    monkeypatch.setattr(_app, "EXTRA_MODULES", ("no_such_module_for_the_test",))
    result = CliRunner().invoke(cli, ["--config", str(world.config), "check", "--format", "json"])
    data = json.loads(result.stdout)
    failed = [c for c in data["checks"] if not c["ok"]]
    assert [(c["name"], c["exit_code"]) for c in failed] == [("enroll_listen", 78)]
    assert failed[0]["message"].startswith("enroll.listen: ")
