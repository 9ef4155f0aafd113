"""An application that embeds lta-worker, on Flask (docs/python-api.md).

    LTA_WORKER_CONFIG=/etc/lta-worker/config.toml APP_WEBHOOK_SECRET_FILE=/etc/app/lta-webhook \
    APP_DB=/var/lib/app/app.db flask --app flask_app:from_environment run

Flask is sync: each request opens its own `LtaApi` (no connection shared across the
server's threads) and runs the async calls with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import httpx
from flask import Flask, redirect, request
from lta_app import create_tables, receive
from standardwebhooks.webhooks import Webhook
from werkzeug.wrappers import Response

from lta_worker.api import EnrollResult, LtaApi, SecretFilter, Settings, load_settings

# The callback's URL holds the consent's one-time code: keep it out of the access log.
logging.getLogger("werkzeug").addFilter(SecretFilter())


def create_app(
    settings: Settings,
    *,
    webhook_secret: str,
    db_path: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Flask:
    """The app: enrollment from a signed-in page, its callback, the webhook receiver."""
    hook = Webhook(webhook_secret)
    create_tables(db_path)
    app = Flask(__name__)

    def signed_in_user() -> str:
        """Stands for the application's own sign-in (its session's user id)."""
        return request.headers["X-User"]

    @app.get("/lta/enroll")
    def enroll() -> Response:
        """Send the signed-in user to the consent."""
        with LtaApi(settings) as lta:  # never migrates
            return redirect(lta.start_enrollment(signed_in_user()), code=303)

    @app.get("/lta/callback")
    def callback() -> dict[str, object]:
        """Where the service sends the browser back: finish the enrollment."""
        user, url = signed_in_user(), request.url

        async def finish() -> EnrollResult:
            async with LtaApi(settings, transport=transport) as lta:
                return await lta.finish_enrollment(user, url)

        result = asyncio.run(finish())
        return {"user": result.user, "scopes": list(result.scopes)}

    @app.post("/lta/webhook")
    def webhook() -> tuple[str, int]:
        """lta-worker's events."""
        return "", receive(hook, db_path, request.get_data(), dict(request.headers))

    return app


def from_environment() -> Flask:
    """The app as configured by the environment (see the module's docstring)."""
    secret = Path(os.environ["APP_WEBHOOK_SECRET_FILE"]).read_text(encoding="utf-8").strip()
    return create_app(load_settings(), webhook_secret=secret, db_path=os.environ["APP_DB"])
