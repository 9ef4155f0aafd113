"""deploy/lta-worker-admin runs a command with the unit's user, environment and credentials
(stand-ins for `systemctl` and `systemd-run` answer as systemd would)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ADMIN = Path(__file__).resolve().parents[2] / "deploy" / "lta-worker-admin"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# What `systemctl show lta-worker.service -p ...` prints with the PostgreSQL drop-in of
# docs/operations.md (`LoadCredential=pgpass:...`, `Environment=PGPASSFILE=%d/pgpass`) and a
# drop-in environment variable and file.
ENVIRONMENT = (
    "LTA_WORKER_LOG_FORMAT=json LTA_WORKER_POLL_CONCURRENCY=4 "
    "PGPASSFILE=/run/credentials/lta-worker.service/pgpass"
)
SHOW = f"""Environment={ENVIRONMENT}
EnvironmentFiles=/etc/default/lta-worker (ignore_errors=yes)
LoadCredential=client-secret:/etc/lta-worker/client-secret
LoadCredential=token-keys:/etc/lta-worker/token-keys
LoadCredential=pgpass:/etc/lta-worker/pgpass
LoadCredential=webhook-secret:/etc/lta-worker/webhook-secret
LoadCredentialEncrypted=
SetCredential=webhook-secret:unset
User=lta-worker
Group=
DynamicUser=yes
StateDirectory=lta-worker
UMask=0077
SupplementaryGroups=
"""


def stand_ins(tmp_path: Path, loaded: set[str]) -> dict[str, str]:
    """`systemctl` answering `show` for the units in `loaded`; `systemd-run` echoing, exit 3."""
    show = tmp_path / "show.txt"
    show.write_text(SHOW)
    systemctl = tmp_path / "systemctl"
    units = " ".join(sorted(loaded))
    systemctl.write_text(
        "#!/bin/bash\n"
        'if [ "$2" = "-p" ] && [ "$3" = "LoadState" ]; then\n'
        f'  case " {units} " in *" $5 "*) echo loaded ;; *) echo not-found ;; esac; exit 0\n'
        "fi\n"
        f'echo "unit=$2" > {tmp_path}/shown\n'
        f"cat {show}\n"
    )
    run = tmp_path / "systemd-run"
    run.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\nexit 3\n')
    for path in (systemctl, run):
        path.chmod(0o755)
    return {
        **os.environ,
        "SYSTEMCTL": str(systemctl),
        "SYSTEMD_RUN": str(run),
        "LTA_WORKER_CONFIG": "/etc/lta-worker/config.toml",
    }


def admin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ADMIN), *args], capture_output=True, text=True, env=env, check=False
    )


def test_admin_passes_the_units_environment_and_credentials(tmp_path: Path) -> None:
    """The unit's environment, credentials, user, state dir and umask reach `systemd-run`."""
    done = admin(stand_ins(tmp_path, {"lta-worker.service"}), "users", "list")
    assert done.returncode == 3, done.stderr
    args = done.stdout.splitlines()
    unit = next(a for a in args if a.startswith("--unit=")).removeprefix("--unit=")
    assert {"--wait", "--pipe", "--collect"} <= set(args)
    assert (
        "--property=Environment=LTA_WORKER_LOG_FORMAT=json LTA_WORKER_POLL_CONCURRENCY=4 "
        f"PGPASSFILE=/run/credentials/{unit}.service/pgpass"
    ) in args
    assert "--property=EnvironmentFile=-/etc/default/lta-worker" in args
    for credential in ("client-secret", "token-keys", "pgpass", "webhook-secret"):
        assert f"--property=LoadCredential={credential}:/etc/lta-worker/{credential}" in args
    # The placeholder too: without it a missing optional file fails the transient unit.
    assert "--property=SetCredential=webhook-secret:unset" in args
    for prop in ("DynamicUser=yes", "User=lta-worker", "StateDirectory=lta-worker", "UMask=0077"):
        assert f"--property={prop}" in args
    assert not any(a in {"--property=Group=", "--property=SupplementaryGroups="} for a in args)
    assert args[-5:] == [
        "/usr/local/bin/lta-worker",
        "--config",
        "/etc/lta-worker/config.toml",
        "users",
        "list",
    ]


def test_admin_falls_back_to_the_timers_unit(tmp_path: Path) -> None:
    """Without lta-worker.service, the settings come from lta-worker-run.service."""
    done = admin(stand_ins(tmp_path, {"lta-worker-run.service"}), "status")
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "shown").read_text().strip() == "unit=lta-worker-run.service"


def test_admin_without_a_unit_is_78(tmp_path: Path) -> None:
    """No unit installed: one line saying so, exit 78, nothing run."""
    done = admin(stand_ins(tmp_path, set()), "status")
    assert done.returncode == 78
    assert "not installed" in done.stderr
    assert done.stdout == ""
