"""An application that embeds lta-worker, on FastAPI (docs/python-api.md).

    LTA_WORKER_CONFIG=/etc/lta-worker/config.toml APP_WEBHOOK_SECRET_FILE=/etc/app/lta-webhook \
    APP_DB=/var/lib/app/app.db uvicorn --factory fastapi_app:from_environment

`client.redirect_uri` is this app's `/lta/callback`; `webhook.url` its `/lta/webhook`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse
from lta_app import create_tables, receive
from standardwebhooks.webhooks import Webhook

from lta_worker.api import LtaApi, SecretFilter, Settings, load_settings

# The callback's URL holds the consent's one-time code: keep it out of the access log.
logging.getLogger("uvicorn.access").addFilter(SecretFilter())


def create_app(
    settings: Settings,
    *,
    webhook_secret: str,
    db_path: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The app: enrollment from a signed-in page, its callback, the webhook receiver."""
    hook = Webhook(webhook_secret)
    create_tables(db_path)
    lta: LtaApi

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal lta
        async with LtaApi(settings, transport=transport) as opened:  # never migrates
            lta = opened
            yield

    app = FastAPI(lifespan=lifespan)

    # `x_user` stands for the application's own sign-in (its session's user id).
    @app.get("/lta/enroll")
    def enroll(x_user: str = Header()) -> RedirectResponse:
        """Send the signed-in user to the consent (a sync route: FastAPI runs it in a
        thread, since `start_enrollment` writes to the database)."""
        return RedirectResponse(lta.start_enrollment(x_user), status_code=303)

    @app.get("/lta/callback")
    async def callback(request: Request, x_user: str = Header()) -> dict[str, object]:
        """Where the service sends the browser back: finish the enrollment."""
        result = await lta.finish_enrollment(x_user, str(request.url))
        return {"user": result.user, "scopes": list(result.scopes)}

    @app.post("/lta/webhook")
    async def webhook(request: Request) -> Response:
        """lta-worker's events (the receiver writes to SQLite: in a thread)."""
        body = await request.body()
        status = await run_in_threadpool(receive, hook, db_path, body, request.headers)
        return Response(status_code=status)

    return app


def from_environment() -> FastAPI:
    """The app as configured by the environment (see the module's docstring)."""
    secret = Path(os.environ["APP_WEBHOOK_SECRET_FILE"]).read_text(encoding="utf-8").strip()
    return create_app(load_settings(), webhook_secret=secret, db_path=os.environ["APP_DB"])
