"""`lta-worker deploy-files --dest DIR`: write out the operations files shipped in the package.

The wheel carries the repository's deploy/ directory (systemd units and timer, cron example,
example config, admin script, Grafana dashboard, Promtail and Vector configs, Prometheus
and Loki alert rules) as
`lta_worker/deploy`; an editable install reads the checkout's deploy/ instead. An operator
who installed with pip or pipx gets them with this command, matching the installed version.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from lta_worker.errors import UsageError


def deploy_source() -> Traversable:
    """The directory of operations files: the package's, or the checkout's deploy/."""
    packaged = resources.files("lta_worker") / "deploy"
    if packaged.is_dir():
        return packaged
    # src/lta_worker/cli/_deploy_cmd.py -> the checkout's top directory.
    return Path(__file__).resolve().parents[3] / "deploy"


def _mode(data: bytes) -> int:
    """Scripts (a `#!` line) are executable; everything else is a plain readable file."""
    return 0o755 if data.startswith(b"#!") else 0o644


def _write(target: Path, data: bytes) -> None:
    """Replace `target` atomically, so that a reader never sees half a unit file."""
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(data)
    os.chmod(partial, _mode(data))
    partial.replace(target)


@click.command("deploy-files")
@click.option("--dest", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the files into (created when missing).")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite files that differ from this version's.")
def deploy_files(dest: Path, force: bool) -> None:
    """Write the systemd units, timer, cron example, example config, admin script, dashboard,
    log shipping configs and alert rules of this version into DEST; one line per file."""
    files = sorted((f for f in deploy_source().iterdir() if f.is_file()), key=lambda f: f.name)
    contents = {f.name: f.read_bytes() for f in files}
    differ = [
        name
        for name, data in contents.items()
        if (dest / name).is_file() and (dest / name).read_bytes() != data
    ]
    if differ and not force:
        raise UsageError(
            f"{dest}: {', '.join(differ)} differ from this version's files; nothing was written",
            hint="compare them with this version's, then pass --force to overwrite",
        )
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for name, data in contents.items():
            target = dest / name
            if target.is_file() and target.read_bytes() == data:
                os.chmod(target, _mode(data))
                click.echo(f"unchanged {target}")
            else:
                _write(target, data)
                click.echo(f"written {target}")
    except OSError as exc:
        raise UsageError(
            f"cannot write {exc.filename or dest}: {exc.strerror}",
            hint="choose a directory you may write to with --dest",
        ) from None
