"""The control API under `/_sim/` (docs/simulator.md, "Control API"): one table of routes,
each calling a `Simulator` control method."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lta_worker.simulator.control_ops import ControlError
from lta_worker.simulator.state import ManualClock, isoformat

if TYPE_CHECKING:
    from lta_worker.simulator.core import Simulator


class _Args:
    """A control request's path parameters and JSON body, read with type checks."""

    def __init__(self, path: dict[str, Any], body: dict[str, Any]) -> None:
        self.path, self.body = path, body

    def __getitem__(self, name: str) -> str:
        return str(self.path[name])

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.body.get(name, default)
        if value is not default and not isinstance(value, kind):
            raise ControlError(f"{name!r} has the wrong type")
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise ControlError(f"{name!r} must be a number")
        return value

    def strs(self, name: str) -> list[str] | None:
        value = self.body.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ControlError(f"{name!r} must be a list of strings")
        return value


Handler = Callable[[_Args], Any]
# The POST routes that answer other than 200 (a handler's None answers 204).
_CREATED = {"/clients": 201, "/users": 201, "/faults": 201, "/consent": 202}


def _endpoint(handler: Handler, status: int) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
        try:
            result = handler(_Args(request.path_params, body))
        except ControlError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if result is None:
            return Response(status_code=204)
        return JSONResponse(result, status_code=status)

    return endpoint


def control_routes(sim: Simulator) -> list[Route]:  # noqa: PLR0915 - one flat table of routes
    """The routes of the control API, bound to `sim` (paths relative to the `/_sim` mount)."""

    def settings(_: _Args | None = None) -> dict[str, Any]:
        return asdict(sim.settings)

    def client_after(a: _Args, change: Callable[[str], object]) -> dict[str, Any]:
        change(a["client"])
        return sim.client_info(a["client"])

    def index(_: _Args) -> Any:
        return {
            "now": isoformat(sim.now()),
            "manual_clock": isinstance(sim.clock, ManualClock),
            "settings": settings(),
            "clients": [sim.client_info(c) for c in sorted(sim.world.clients)],
        }

    def add_client(a: _Args) -> Any:
        client = a.get("client", str, "")
        sim.add_client(
            client,
            a.get("secret", str, ""),
            long_term=a.get("long_term", bool, False),
            redirect_uris=a.strs("redirect_uris"),
            scopes=a.strs("scopes"),
        )
        return sim.client_info(client)

    def withdraw(a: _Args) -> Any:
        return {"revoked": sim.withdraw_mode(a["client"])}

    def scopes(a: _Args) -> Any:
        return client_after(a, lambda c: sim.set_client_scopes(c, a.strs("scopes") or []))

    def redirect_uri(a: _Args) -> Any:
        return client_after(a, lambda c: sim.add_redirect_uri(c, a.get("uri", str, "")))

    def add_user(a: _Args) -> Any:
        user = a.get("user", str, "")
        payloads = a.get("payloads", dict, None)
        sim.add_user(
            user,
            linked=a.get("linked", bool, True),
            last_sync_age_days=a.get("last_sync_age_days", (int, float), 1.0),
            payloads=payloads,
        )
        return sim.user_info(user)

    def revoke(a: _Args) -> Any:
        return {"revoked": sim.revoke(a["user"], a.get("client", str, None))}

    def sync(a: _Args) -> Any:
        linked = a.get("linked", bool, None)
        age = a.get("last_sync_age_days", (int, float), None)
        sim.set_sync(a["user"], linked=linked, last_sync_age_days=age)
        return sim.user_info(a["user"])

    def set_payloads(a: _Args) -> Any:
        for endpoint, payload in a.body.items():
            sim.set_payload(a["user"], endpoint, payload)
        return sim.user_info(a["user"])

    def consent(a: _Args) -> Any:
        user, scopes = a.get("user", str, ""), a.strs("scopes")
        return {"queued": sim.queue_consent(user, scopes, deny=a.get("deny", bool, False))}

    def put_settings(a: _Args) -> Any:
        try:
            sim.configure(**a.body)
        except TypeError as exc:  # pragma: no cover - configure checks names first
            raise ControlError(str(exc)) from exc
        return settings()

    def get_budget(a: _Args) -> Any:
        sim.client_info(a["client"])  # 404 for an unknown client
        return asdict(sim.budget_of(a["client"]))

    def consume(a: _Args) -> Any:
        client = a.get("client", str, "")
        return {"client": client, "remaining": sim.consume_budget(client, a.get("count", int, 1))}

    def add_fault(a: _Args) -> Any:
        if "seed" in a.body:
            sim.seed_faults(a.get("seed", int, None))
        ms = a.get("ms", (int, float), None)
        rule = sim.inject_fault(
            a.get("kind", str, ""),
            rate=a.get("rate", (int, float), None),
            count=a.get("next", int, None),
            delay=None if ms is None else ms / 1000,
        )
        return asdict(rule)

    def move_clock(a: _Args) -> Any:
        if "set" in a.body:
            try:
                when = datetime.fromisoformat(a.get("set", str, ""))
            except ValueError as exc:
                raise ControlError("'set' must be an ISO 8601 time") from exc
            sim.set_time(when)
        if "advance" in a.body:
            sim.advance(a.get("advance", (int, float), 0))
        return {"now": isoformat(sim.now())}

    def faults(_: _Args) -> Any:
        return {"seed": sim.faults.seed, "rules": [asdict(r) for r in sim.faults.rules]}

    def clock(_: _Args) -> Any:
        return {"now": isoformat(sim.now()), "manual": isinstance(sim.clock, ManualClock)}

    def log(_: _Args) -> Any:
        return [{**asdict(entry), "at": isoformat(entry.at)} for entry in sim.requests()]

    table: list[tuple[str, str, Handler]] = [
        ("GET", "/", index),
        ("POST", "/clients", add_client),
        ("GET", "/clients/{client}", lambda a: sim.client_info(a["client"])),
        ("POST", "/clients/{client}/withdraw", withdraw),
        ("POST", "/clients/{client}/reopen", lambda a: client_after(a, sim.reopen_mode)),
        ("PUT", "/clients/{client}/scopes", scopes),
        ("POST", "/clients/{client}/redirect-uris", redirect_uri),
        ("POST", "/users", add_user),
        ("GET", "/users/{user}", lambda a: sim.user_info(a["user"])),
        ("DELETE", "/users/{user}", lambda a: {"revoked": sim.delete_account(a["user"])}),
        ("POST", "/users/{user}/revoke", revoke),
        ("PUT", "/users/{user}/sync", sync),
        ("PUT", "/users/{user}/payloads", set_payloads),
        ("POST", "/consent", consent),
        ("GET", "/settings", settings),
        ("PUT", "/settings", put_settings),
        ("GET", "/budget/{client}", get_budget),
        ("POST", "/budget/consume", consume),
        ("GET", "/faults", faults),
        ("POST", "/faults", add_fault),
        ("DELETE", "/faults", lambda _: sim.clear_faults()),
        ("GET", "/clock", clock),
        ("POST", "/clock", move_clock),
        ("GET", "/requests", log),
        ("DELETE", "/requests", lambda _: sim.clear_requests()),
        ("POST", "/reset", lambda _: sim.reset()),
    ]
    return [
        Route(path, _endpoint(h, _CREATED.get(path, 200) if m == "POST" else 200), methods=[m])
        for m, path, h in table
    ]
