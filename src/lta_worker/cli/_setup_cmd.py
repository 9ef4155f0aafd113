"""Setting up an installation: `db upgrade`, `keys generate|rotate` and `deploy-files`."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import ConfigError, UsageError


@click.group()
def db() -> None:
    """Database schema."""


@db.command()
@pass_app
def upgrade(app: App) -> None:
    """Apply the pending schema migrations to database.url.

    Exits 78 when the database was migrated by a newer lta-worker (nothing is changed).
    """
    from lta_worker.storage import HEAD_REVISION

    with app.runtime() as runtime:
        _ = runtime.store  # opening it applies the pending migrations
    if runtime.migrated:
        click.echo(f"database schema upgraded to revision {HEAD_REVISION}")
    else:
        click.echo(f"database schema is current (revision {HEAD_REVISION})")


@click.group()
def keys() -> None:
    """Manage the token key file (crypto.key_file)."""


@keys.command()
def generate() -> None:
    """Print a new key line `ID:BASE64(32 bytes)` for the key file (newest last).

    Only the line goes to stdout, so `>> KEYFILE` works; keep the file mode 0600.
    """
    from lta_worker.storage import generate_key_line

    click.echo(generate_key_line(datetime.now(UTC)))
    if sys.stdout.isatty():
        click.echo(
            "# append this line to the key file (mode 0600), then run `lta-worker keys rotate`",
            err=True,
        )


@keys.command()
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    default=200,
    show_default=True,
    help="Rows re-encrypted per transaction.",
)
@pass_app
def rotate(app: App, batch_size: int) -> None:
    """Re-encrypt every stored token under the newest key of the key file.

    Exits 78, with nothing modified, when a stored token uses a key id the key file does not
    list or the key file is unusable.
    """
    from lta_worker.logs import get_logger
    from lta_worker.storage import rotate_keys

    with app.runtime() as runtime:
        vault = runtime.vault  # the key file first: a problem with it touches nothing
        report = rotate_keys(runtime.store, vault, runtime.clock.now(), batch=batch_size)
    get_logger("lta_worker.keys").info(
        "keys.rotated",
        rotated=report.rotated,
        already_current=report.already_current,
        failed=report.failed,
        key_id=report.key_id,
    )
    click.echo(
        f"key {report.key_id}: {report.rotated} re-encrypted, "
        f"{report.already_current} already current, {report.failed} failed"
    )
    if report.failed:
        raise ConfigError(
            f"{report.failed} stored secret(s) did not decrypt and were left unchanged",
            key="crypto.key_file",
            hint="keep the older key lines; see `lta-worker users list` for affected users",
        )
    click.echo("every stored token uses the newest key; older key lines may now be removed")


def deploy_source() -> Traversable:
    """The directory of operations files: the package's, or the checkout's deploy/."""
    packaged = resources.files("lta_worker") / "deploy"
    if packaged.is_dir():
        return packaged
    # src/lta_worker/cli/_setup_cmd.py -> the checkout's top directory.
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
