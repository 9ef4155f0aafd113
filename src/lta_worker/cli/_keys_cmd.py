"""`lta-worker keys generate|rotate`: make key lines, move stored tokens to the newest key.

Rotating keys, step by step:

1. `(umask 077; lta-worker keys generate >> KEYFILE)` appends a new key line (it becomes the
   newest: the last line encrypts, every line decrypts).
2. `lta-worker keys rotate` re-encrypts every stored token and pending-enrollment verifier
   under it, in batches; it can be interrupted and run again.
3. Once it reports 0 failed, remove the older key lines.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import ConfigError


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
    if not sys.stdout.isatty():
        return
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
