"""The control API under `/_sim/` (a prefix the real service never uses): JSON in, JSON out.

Each route calls one `Simulator` control method; a `ControlError` becomes its status with
`{"error": message}`, and a malformed body a 400. Nothing here ever returns a token or a
client secret.

The routes, their bodies and answers are listed in docs/simulator.md (a test keeps the
list equal to `control_routes`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lta_worker.simulator.clock import ManualClock, isoformat
from lta_worker.simulator.control_ops import ControlError

if TYPE_CHECKING:
    from lta_worker.simulator.core import Simulator

Handler = Callable[[Request, dict[str, Any]], Awaitable[Any]]


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is not default and not isinstance(value, kind):
        raise ControlError(f"{name!r} has the wrong type")
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ControlError(f"{name!r} must be a number")
    return value


def _str_list(body: dict[str, Any], name: str) -> list[str] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ControlError(f"{name!r} must be a list of strings")
    return value


def _endpoint(handler: Handler, status: int = 200) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        body: dict[str, Any] = {}
        raw = await request.body()
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            if not isinstance(parsed, dict):
                return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
            body = parsed
        try:
            result = await handler(request, body)
        except ControlError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if result is None:
            return Response(status_code=204)
        return JSONResponse(result, status_code=status)

    return endpoint


def control_routes(sim: Simulator) -> list[Route]:  # noqa: PLR0915 - one flat table of routes
    """The routes of the control API, bound to `sim` (paths relative to the `/_sim` mount)."""

    def settings_json() -> dict[str, Any]:
        return asdict(sim.settings)

    async def index(_: Request, __: dict[str, Any]) -> Any:
        return {
            "now": isoformat(sim.now()),
            "manual_clock": isinstance(sim.clock, ManualClock),
            "settings": settings_json(),
            "clients": [sim.client_info(c) for c in sorted(sim.world.clients)],
        }

    async def add_client(_: Request, body: dict[str, Any]) -> Any:
        client = _field(body, "client", str, "")
        sim.add_client(
            client,
            _field(body, "secret", str, ""),
            long_term=_field(body, "long_term", bool, False),
            redirect_uris=_str_list(body, "redirect_uris"),
            scopes=_str_list(body, "scopes"),
        )
        return sim.client_info(client)

    async def get_client(request: Request, _: dict[str, Any]) -> Any:
        return sim.client_info(request.path_params["client"])

    async def withdraw(request: Request, _: dict[str, Any]) -> Any:
        return {"revoked": sim.withdraw_mode(request.path_params["client"])}

    async def reopen(request: Request, _: dict[str, Any]) -> Any:
        sim.reopen_mode(request.path_params["client"])
        return sim.client_info(request.path_params["client"])

    async def client_scopes(request: Request, body: dict[str, Any]) -> Any:
        sim.set_client_scopes(request.path_params["client"], _str_list(body, "scopes") or [])
        return sim.client_info(request.path_params["client"])

    async def redirect_uri(request: Request, body: dict[str, Any]) -> Any:
        sim.add_redirect_uri(request.path_params["client"], _field(body, "uri", str, ""))
        return sim.client_info(request.path_params["client"])

    async def add_user(_: Request, body: dict[str, Any]) -> Any:
        user = _field(body, "user", str, "")
        payloads = _field(body, "payloads", dict, None)
        sim.add_user(
            user,
            linked=_field(body, "linked", bool, True),
            last_sync_age_days=_field(body, "last_sync_age_days", (int, float), 1.0),
            payloads=payloads,
        )
        return sim.user_info(user)

    async def get_user(request: Request, _: dict[str, Any]) -> Any:
        return sim.user_info(request.path_params["user"])

    async def delete_user(request: Request, _: dict[str, Any]) -> Any:
        return {"revoked": sim.delete_account(request.path_params["user"])}

    async def revoke(request: Request, body: dict[str, Any]) -> Any:
        client = _field(body, "client", str, None)
        return {"revoked": sim.revoke(request.path_params["user"], client)}

    async def sync(request: Request, body: dict[str, Any]) -> Any:
        user = request.path_params["user"]
        sim.set_sync(
            user,
            linked=_field(body, "linked", bool, None),
            last_sync_age_days=_field(body, "last_sync_age_days", (int, float), None),
        )
        return sim.user_info(user)

    async def set_payloads(request: Request, body: dict[str, Any]) -> Any:
        user = request.path_params["user"]
        for endpoint, payload in body.items():
            sim.set_payload(user, endpoint, payload)
        return sim.user_info(user)

    async def consent(_: Request, body: dict[str, Any]) -> Any:
        queued = sim.queue_consent(
            _field(body, "user", str, ""),
            _str_list(body, "scopes"),
            deny=_field(body, "deny", bool, False),
        )
        return {"queued": queued}

    async def get_settings(_: Request, __: dict[str, Any]) -> Any:
        return settings_json()

    async def put_settings(_: Request, body: dict[str, Any]) -> Any:
        try:
            sim.configure(**body)
        except TypeError as exc:  # pragma: no cover - configure checks names first
            raise ControlError(str(exc)) from exc
        return settings_json()

    async def get_budget(request: Request, _: dict[str, Any]) -> Any:
        client = request.path_params["client"]
        sim.client_info(client)  # 404 for an unknown client
        return asdict(sim.budget_of(client))

    async def consume(_: Request, body: dict[str, Any]) -> Any:
        client = _field(body, "client", str, "")
        remaining = sim.consume_budget(client, _field(body, "count", int, 1))
        return {"client": client, "remaining": remaining}

    async def get_faults(_: Request, __: dict[str, Any]) -> Any:
        return {"seed": sim.faults.seed, "rules": [asdict(r) for r in sim.faults.rules]}

    async def add_fault(_: Request, body: dict[str, Any]) -> Any:
        if "seed" in body:
            sim.seed_faults(_field(body, "seed", int, None))
        ms = _field(body, "ms", (int, float), None)
        rule = sim.inject_fault(
            _field(body, "kind", str, ""),
            rate=_field(body, "rate", (int, float), None),
            count=_field(body, "next", int, None),
            delay=None if ms is None else ms / 1000,
        )
        return asdict(rule)

    async def clear_faults(_: Request, __: dict[str, Any]) -> Any:
        sim.clear_faults()
        return None

    async def get_clock(_: Request, __: dict[str, Any]) -> Any:
        return {"now": isoformat(sim.now()), "manual": isinstance(sim.clock, ManualClock)}

    async def move_clock(_: Request, body: dict[str, Any]) -> Any:
        if "set" in body:
            try:
                when = datetime.fromisoformat(_field(body, "set", str, ""))
            except ValueError as exc:
                raise ControlError("'set' must be an ISO 8601 time") from exc
            sim.set_time(when)
        if "advance" in body:
            sim.advance(_field(body, "advance", (int, float), 0))
        return {"now": isoformat(sim.now())}

    async def requests(_: Request, __: dict[str, Any]) -> Any:
        return [{**asdict(entry), "at": isoformat(entry.at)} for entry in sim.requests()]

    async def clear_requests(_: Request, __: dict[str, Any]) -> Any:
        sim.clear_requests()
        return None

    async def reset(_: Request, __: dict[str, Any]) -> Any:
        sim.reset()
        return None

    def route(path: str, handler: Handler, method: str, status: int = 200) -> Route:
        return Route(path, _endpoint(handler, status), methods=[method])

    return [
        route("/", index, "GET"),
        route("/clients", add_client, "POST", 201),
        route("/clients/{client}", get_client, "GET"),
        route("/clients/{client}/withdraw", withdraw, "POST"),
        route("/clients/{client}/reopen", reopen, "POST"),
        route("/clients/{client}/scopes", client_scopes, "PUT"),
        route("/clients/{client}/redirect-uris", redirect_uri, "POST"),
        route("/users", add_user, "POST", 201),
        route("/users/{user}", get_user, "GET"),
        route("/users/{user}", delete_user, "DELETE"),
        route("/users/{user}/revoke", revoke, "POST"),
        route("/users/{user}/sync", sync, "PUT"),
        route("/users/{user}/payloads", set_payloads, "PUT"),
        route("/consent", consent, "POST", 202),
        route("/settings", get_settings, "GET"),
        route("/settings", put_settings, "PUT"),
        route("/budget/{client}", get_budget, "GET"),
        route("/budget/consume", consume, "POST"),
        route("/faults", get_faults, "GET"),
        route("/faults", add_fault, "POST", 201),
        route("/faults", clear_faults, "DELETE"),
        route("/clock", get_clock, "GET"),
        route("/clock", move_clock, "POST"),
        route("/requests", requests, "GET"),
        route("/requests", clear_requests, "DELETE"),
        route("/reset", reset, "POST"),
    ]
