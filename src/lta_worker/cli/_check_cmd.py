"""`lta-worker check [--format table|json]`: verify everything `run` needs, writing nothing."""

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
    from lta_worker.cli._failure import classify, one_line
    from lta_worker.errors import LtaError
    from lta_worker.logs import scrub

    def failed(name: str, exc: BaseException) -> dict[str, Any]:
        failure = classify(exc)
        return {
            "name": name,
            "ok": False,
            "detail": "unusable",
            "exit_code": failure.exit_code,
            "error": failure.error,
            "message": one_line(scrub(failure.message)),
            "hint": scrub(failure.hint) if failure.hint else None,
        }

    errors: list[BaseException] = []
    try:
        settings = app.settings
    except LtaError as exc:  # nothing else can be checked; `--format json` still prints
        errors.append(exc)
        checks = [failed("config", exc)]
    else:
        app.configure_logging()
        import anyio

        from lta_worker.worker import run_checks

        checks = [{"name": "config", "ok": True, "detail": "loaded"}]
        for result in anyio.run(run_checks, settings):
            if result.error is None:
                checks.append({"name": result.name, "ok": True, "detail": result.detail})
            else:
                errors.append(result.error)
                checks.append({**failed(result.name, result.error), "detail": result.detail})
        if settings.enroll.listen is not None:  # what `serve` refuses at start, in the CLI
            from lta_worker.cli._app import require_extra

            try:
                require_extra("web")
            except LtaError as exc:  # the address may be free: `serve` still cannot start
                errors.append(exc)
                checks = [c for c in checks if c["name"] != "enroll_listen"]
                checks.append(failed("enroll_listen", exc))
    code = _exit_code([entry["exit_code"] for entry in checks if not entry["ok"]])
    if fmt == "json":
        click.echo(json.dumps({"ok": code == EX_OK, "exit_code": code, "checks": checks}, indent=2))
    else:
        for entry in checks:
            if entry["ok"]:
                click.echo(f"ok    {entry['name']:<14} {entry['detail']}")
            else:
                hint = f" ({entry['hint']})" if entry["hint"] else ""
                click.echo(f"FAIL  {entry['name']:<14} {entry['message']}{hint}")
    # The CLI's boundary writes the first problem of the exit code's kind as the `error`
    # event on stderr, as every failing command ends (a bug alone has none: 78, no event).
    worst = next((e for e in errors if classify(e).exit_code == code), None)
    if worst is not None:
        raise worst
    sys.exit(code)
