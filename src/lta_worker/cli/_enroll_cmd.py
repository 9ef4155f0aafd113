"""`lta-worker enroll url|finish|token|link --user ID`: enroll a user for long term access.
Secrets come from stdin, never an argument (`ps`, shell history and audit logs keep those).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import click

from lta_worker.cli._app import App, pass_app, user_option
from lta_worker.errors import UsageError
from lta_worker.secret import Secret

if TYPE_CHECKING:
    from lta_worker.enrollment import Enrollment, EnrollResult

_MAX_INPUT = 64 * 1024


def read_secret_input(prompt: str) -> Secret:
    """Read one secret value from stdin (hidden prompt on a terminal); UsageError when empty."""
    stream = sys.stdin
    if stream.isatty():
        value = click.prompt(prompt, hide_input=True, err=True, default="", show_default=False)
    else:
        value = stream.read(_MAX_INPUT)
    value = value.strip()
    if not value:
        raise UsageError(f"nothing was read from stdin: {prompt.lower()} is expected there")
    return Secret(value)


def _confirmation(result: EnrollResult) -> str:
    scopes = ", ".join(result.scopes) if result.scopes else "no scope"
    rotated = " (rotated: the previous token no longer works)" if result.rotated else ""
    return f"enrolled {result.user!r} with {scopes}{rotated}"


@click.group("enroll")
def enroll() -> None:
    """Enroll a user: consent URL, then the redirect back (or a user access token)."""


@enroll.command("url")
@user_option
@pass_app
def url(app: App, user: str) -> None:
    """Print the consent URL for USER (PKCE S256 and state saved for 10 minutes)."""
    runtime = app.runtime()
    import anyio

    async def main() -> str:
        async with runtime:
            return runtime.enrollment().start(user)

    click.echo(anyio.run(main))


@enroll.command("link")
@user_option
@click.option(
    "--valid",
    "valid",
    default="24h",
    show_default=True,
    metavar="D",
    help="How long the link works, 1m to 30d (it works once).",
)
@pass_app
def link(app: App, user: str, valid: str) -> None:
    """Print a signed link that starts USER's enrollment in the browser (`serve` hosts it)."""
    from lta_worker.config import parse_duration, start_url
    from lta_worker.enrollment import EnrollLinks
    from lta_worker.runtime import Runtime

    try:
        lifetime = parse_duration(valid)
    except ValueError as exc:
        raise UsageError(f"--valid: {exc}") from None
    runtime = Runtime(app.settings)
    start = start_url(runtime.settings)  # a missing public URL is named before the key file
    links = EnrollLinks(runtime.secret("enroll_link_key"), start)
    click.echo(links.make(user, runtime.clock.now(), lifetime))


def _enroll_from_stdin(
    app: App,
    prompt: str,
    action: Callable[[Enrollment, Secret], Awaitable[EnrollResult]],
) -> None:
    """Read one secret from stdin, run `action` with it, print the confirmation."""
    runtime = app.runtime()
    secret = read_secret_input(prompt)

    import anyio

    from lta_worker.logs import register_secret

    register_secret(secret)

    async def main() -> EnrollResult:
        async with runtime:
            return await action(runtime.enrollment(), secret)

    click.echo(_confirmation(anyio.run(main)))


@enroll.command("finish")
@user_option
@pass_app
def finish(app: App, user: str) -> None:
    """Read the redirect URL (or the code) from stdin, create and store the long term token."""
    _enroll_from_stdin(
        app,
        "Redirect URL or code",
        lambda enrollment, answer: enrollment.finish(user, answer.reveal()),
    )


@enroll.command("token")
@user_option
@pass_app
def token(app: App, user: str) -> None:
    """Read a user access token from stdin, create and store the long term token."""
    _enroll_from_stdin(
        app,
        "User access token",
        lambda enrollment, secret: enrollment.from_user_token(user, secret),
    )
