"""The public API at `{base_url}`: the two reads, and the endpoints that refuse long term tokens.

Each route asks `Simulator` for a `PublicAnswer` (authentication, budget, fault and verdict
are decided there, under its lock) and renders it; only the waiting of latency and stall
faults happens here, outside the lock, with the simulator's cancellable `sleep`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from lta_worker.simulator import faults
from lta_worker.simulator.responses import json_response, refusal_response
from lta_worker.simulator.state import Endpoint

if TYPE_CHECKING:
    from lta_worker.simulator.core import PublicAnswer, Simulator

READ_PATHS: dict[str, Endpoint] = {
    "/api/v1/history/latest-change": "latest-change",
    "/api/v1/history/stats": "stats",
}
# Spec 1: these accept a regular user token only, even from a client with the mode.
REGULAR_ONLY_PATHS = (
    "/api/v1/history/changes",
    "/api/v1/history/accidents",
    "/api/v1/stocks",
    "/api/v1/types",
)


def _render(sim: Simulator, answer: PublicAnswer) -> Response:
    if answer.refusal is not None:
        return refusal_response(answer.refusal, sim.settings.error_style, answer.headers)
    return json_response(answer.payload, 200, answer.headers)


async def _apply_fault(sim: Simulator, answer: PublicAnswer) -> Response:
    fault = answer.fault
    if fault is None:
        return _render(sim, answer)
    if fault.kind in {"latency", "stall"}:
        await sim.sleep(fault.delay)
        return _render(sim, answer)
    if fault.kind == "drop":
        return faults.DropResponse()
    if fault.kind == "broken_json":
        body = json.dumps(answer.payload).encode() if answer.payload is not None else b""
        return faults.broken_json(body, answer.headers)
    return faults.error_response(fault.kind, answer.headers)


def api_routes(sim: Simulator) -> list[Route]:
    """The routes of the public API, bound to `sim`."""

    def read_endpoint(endpoint: Endpoint) -> Route:
        async def read(request: Request) -> Response:
            answer = sim.handle_read(
                endpoint,
                request.url.path,
                request.headers.get("authorization"),
                request.headers.get("ds-api-client-id"),
                method=request.method,
            )
            return await _apply_fault(sim, answer)

        path = next(p for p, e in READ_PATHS.items() if e == endpoint)
        return Route(path, read, methods=["GET"])

    async def regular_only(request: Request) -> Response:
        answer = sim.handle_other(
            request.url.path,
            request.headers.get("authorization"),
            request.headers.get("ds-api-client-id"),
            method=request.method,
        )
        return _render(sim, answer)

    routes = [read_endpoint(e) for e in READ_PATHS.values()]
    routes += [Route(p, regular_only, methods=["GET"]) for p in REGULAR_ONLY_PATHS]
    return routes
