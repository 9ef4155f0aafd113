"""`lta-worker check [--format table|json]`: verify the configuration, the secret and key
files, the database and the service, writing nothing.

Exit 0 every check passed; 78 a configuration problem (a file, a setting, no database or an
old schema: `db upgrade`); 75 only temporary ones (the database or the service cannot be
reached). The configuration itself is loaded first: a broken one is the usual one error line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import EX_CONFIG, EX_OK, EX_TEMPFAIL


def _exit_code(codes: list[int]) -> int:
    """The worst code: configuration beats temporary beats ok (a bug counts as 78)."""
    if not codes:
        return EX_OK
    if all(code == EX_TEMPFAIL for code in codes):
        return EX_TEMPFAIL
    return EX_CONFIG


@click.command("check")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@pass_app
def check(app: App, fmt: str) -> None:
    """Check config, secret and key files, database and service; write nothing."""
    settings = app.settings
    app.configure_logging()

    import anyio

    from lta_worker.cli._failure import classify, one_line
    from lta_worker.logs import scrub
    from lta_worker.worker import run_checks

    results = anyio.run(run_checks, settings)
    checks: list[dict[str, Any]] = [{"name": "config", "ok": True, "detail": "loaded"}]
    codes: list[int] = []
    for result in results:
        entry: dict[str, Any] = {"name": result.name, "ok": result.ok, "detail": result.detail}
        if result.error is not None:
            failure = classify(result.error)
            codes.append(failure.exit_code)
            entry.update(
                exit_code=failure.exit_code,
                error=failure.error,
                message=one_line(scrub(failure.message)),
                hint=scrub(failure.hint) if failure.hint else None,
            )
        checks.append(entry)
    code = _exit_code(codes)
    if fmt == "json":
        click.echo(json.dumps({"ok": code == EX_OK, "exit_code": code, "checks": checks}, indent=2))
    else:
        for entry in checks:
            if entry["ok"]:
                click.echo(f"ok    {entry['name']:<14} {entry['detail']}")
            else:
                hint = f" ({entry['hint']})" if entry["hint"] else ""
                click.echo(f"FAIL  {entry['name']:<14} {entry['message']}{hint}")
    sys.exit(code)
