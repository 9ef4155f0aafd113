"""Lines an operator reads, through the real entry point in-process: `check` tries the
listeners' addresses, `run` names a broken secret file before the database's lock (a missing
SQLite file: test_readonly_cmds.py)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from lta_worker.storage import Store

from .test_readonly_cmds import cli, write_config


def _listening(tmp_path: Path, section: str, port: int) -> str:
    """The config lines that make `serve` listen on `port` for `section`."""
    if section == "metrics":
        return f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    keys = tmp_path / "link-key"
    keys.write_text("k" * 44 + "\n")
    keys.chmod(0o600)
    public = f"http://127.0.0.1:{port}"
    return (
        f'[enroll]\nlisten = "127.0.0.1:{port}"\npublic_url = "{public}"\n'
        f"link_key_file = {str(keys)!r}\n"
    )


@pytest.mark.parametrize("section", ["metrics", "enroll"])
def test_check_tries_the_listen_address(tmp_path: Path, section: str) -> None:
    """A listen address another process holds fails `check` with 78 naming it; a free one passes."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'lta.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base = config.read_text().replace(
            "[client]\n", f'[client]\nredirect_uri = "http://127.0.0.1:{port}/lta/callback"\n'
        )
        config.write_text(base + _listening(tmp_path, section, port))
        done = cli(config, "check", "--format", "json")
    listen = {c["name"]: c for c in json.loads(done.stdout)["checks"]}[f"{section}_listen"]
    assert (done.returncode, listen["ok"], listen["exit_code"]) == (78, False, 78)
    assert listen["message"].startswith(f"{section}.listen: ")
    assert "another process holds it" in listen["hint"]
    done = cli(config, "check", "--format", "json")  # now free
    assert {c["name"]: c for c in json.loads(done.stdout)["checks"]}[f"{section}_listen"]["ok"]
    with socket.socket() as again:  # and let go at once
        again.bind(("127.0.0.1", port))


def test_run_names_a_broken_secret_file_before_the_lock(tmp_path: Path) -> None:
    """A broken secret file under a held lock: `run` exits 78 naming it, not 75."""
    url = f"sqlite:///{tmp_path / 'lta.db'}"
    config = write_config(tmp_path, url)
    (tmp_path / "secret").chmod(0o644)
    with Store.open(url) as store:
        store.upgrade()
        with store.single_instance_lock():
            done = cli(config, "run")
    event = json.loads(done.stderr.splitlines()[-1])
    assert (done.returncode, event["key"]) == (78, "client.secret_file"), event


def test_check_names_the_fix_for_a_secret_file_it_may_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreadable secret file fails `check` with 78 and a `LoadCredential=` hint."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'lta.db'}")
    secret, real_open = str(tmp_path / "secret"), os.open

    def denied(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == secret:  # as root, no mode makes the file unreadable: say it is
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", denied)
    done = cli(config, "check", "--format", "json")
    failed = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["client_secret"]
    assert (done.returncode, failed["exit_code"]) == (78, 78)
    assert "Permission denied" in failed["message"] and "LoadCredential=" in failed["hint"]
