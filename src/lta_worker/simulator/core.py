"""`Simulator`: the service's whole state and behaviour, with no I/O; the routes call one
`handle_*` method each. One lock guards the state (uvicorn's thread, or a test's own)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import anyio

from lta_worker.simulator import access, budget, oauth
from lta_worker.simulator.control_ops import ControlOps
from lta_worker.simulator.responses import FaultPlan, FaultRule, Refusal
from lta_worker.simulator.state import (
    ANONYMOUS,
    AuthKind,
    Client,
    Clock,
    Endpoint,
    LogEntry,
    SimSettings,
    SystemClock,
    World,
    default_clients,
    other_endpoint,
)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PublicAnswer:
    """What a public-API request comes to, before rendering: status, the payload of a 200 or
    the refusal, RateLimit headers (and Retry-After), and the fault that replaces or delays it."""

    status: int
    payload: Any = None
    refusal: Refusal | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    fault: FaultRule | None = None


def _as_seen(
    fault: FaultRule | None, status: int, code: str | None
) -> tuple[int | None, str | None]:
    """The status and code a client gets once `fault` replaces the answer (None: no answer)."""
    if fault is None or fault.kind == "latency":
        return status, code
    if fault.kind in {"500", "502", "503"}:
        return int(fault.kind), None
    if fault.kind == "broken_json":
        return 200, None
    return None, None  # drop, stall


class Simulator(ControlOps):
    """A faithful in-memory stand-in for the Long Term Access service.

    `seed` seeds the fault generator (reproducible rate-based faults); `sleep` is how latency
    and stall faults wait (`anyio.sleep`, cancellable, by default).
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        settings: SimSettings | None = None,
        clients: Iterable[Client] | None = None,
        seed: int | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.sleep: Sleep = sleep or anyio.sleep
        self._lock = threading.RLock()
        self._initial_settings = settings or SimSettings()
        self._initial_clients = [replace(c) for c in (clients or default_clients())]
        self._seed = seed
        self.settings = self._initial_settings
        self.faults = FaultPlan(seed)
        self.world = World()
        self._install_clients()

    def _install_clients(self) -> None:
        for client in self._initial_clients:
            copy = replace(
                client,
                redirect_uris=set(client.redirect_uris),
                enabled_scopes=set(client.enabled_scopes),
            )
            self.world.clients[copy.id] = copy

    def reset(self) -> None:
        """Back to the initial clients and settings: no users, tokens, log, faults or budget."""
        with self._lock:
            self.settings = self._initial_settings
            self.faults = FaultPlan(self._seed)
            self.world = World()
            self._install_clients()

    def _log(
        self,
        method: str,
        path: str,
        auth: AuthKind,
        who: access.Caller | oauth.AuthorizeAnswer | oauth.TokenAnswer | None,
        status: int | None,
        *,
        code: str | None = None,
        fault: str | None = None,
    ) -> None:
        client, user = (who.client, who.user) if who is not None else (None, None)
        self.world.log.append(
            LogEntry(method, path, auth, client, user, status, code, self.now(), fault)
        )

    def requests(self) -> list[LogEntry]:
        """Every request seen so far, oldest first (never a credential or query string)."""
        with self._lock:
            return list(self.world.log)

    def clear_requests(self) -> None:
        """Empty the request log."""
        with self._lock:
            self.world.log.clear()

    def _count(self, key: str, now: datetime) -> tuple[bool, list[tuple[str, str]]]:
        """Count one public-API request against `key`'s window; (allowed, headers)."""
        s, ts = self.settings, now.timestamp()
        window, allowed = budget.take(self.world.budgets.get(key), ts, s.budget, s.window)
        self.world.budgets[key] = window
        quota = budget.quota(window, ts, s.budget, s.window)
        headers = budget.render(s.header_format, quota)
        if not allowed:
            headers.append(("Retry-After", str(budget.retry_after(quota))))
        return allowed, headers

    def handle_read(
        self,
        endpoint: Endpoint,
        path: str,
        authorization: str | None,
        client_header: str | None,
        *,
        method: str = "GET",
    ) -> PublicAnswer:
        """Decide `GET {base_url}/api/v1/history/<endpoint>`: auth, budget, faults, verdict."""
        with self._lock:
            now = self.now()
            caller = access.identify(self.world, authorization, client_header, now)
            allowed, headers = self._count(caller.client or ANONYMOUS, now)
            if not allowed:
                self._log(method, path, caller.auth, caller, 429)
                return PublicAnswer(429, refusal=Refusal(429), headers=headers)
            fault = self.faults.draw()
            refusal, payload = access.read(self.world, self.settings, caller, endpoint, now)
            status = refusal.status if refusal else 200
            code = refusal.code if refusal else None
            logged, code = _as_seen(fault, status, code)
            kind = fault.kind if fault else None
            self._log(method, path, caller.auth, caller, logged, code=code, fault=kind)
            return PublicAnswer(status, payload, refusal, headers, fault)

    def handle_other(
        self,
        path: str,
        authorization: str | None,
        client_header: str | None,
        *,
        method: str = "GET",
    ) -> PublicAnswer:
        """Decide a public endpoint that accepts only a regular user token (spec 1)."""
        with self._lock:
            now = self.now()
            caller = access.identify(self.world, authorization, client_header, now, long_term=False)
            allowed, headers = self._count(caller.client or ANONYMOUS, now)
            if not allowed:
                self._log(method, path, caller.auth, caller, 429)
                return PublicAnswer(429, refusal=Refusal(429), headers=headers)
            if caller.refusal is not None or caller.user is None:
                refusal = caller.refusal or Refusal(401)
                self._log(method, path, caller.auth, None, refusal.status, code=refusal.code)
                return PublicAnswer(refusal.status, refusal=refusal, headers=headers)
            self._log(method, path, caller.auth, caller, 200)
            return PublicAnswer(200, other_endpoint(path, caller.user), headers=headers)

    def handle_authorize(self, path: str, params: Mapping[str, str]) -> oauth.AuthorizeAnswer:
        """Decide `GET {auth_url}/oidc/auth` (consent)."""
        with self._lock:
            answer = oauth.authorize(self.world, self.settings, params, self.now())
            status = 200 if answer.page else 400 if answer.location is None else 302
            self._log("GET", path, "none", answer, status, code=answer.error)
            return answer

    def handle_consent(self, path: str, form: Mapping[str, list[str]]) -> oauth.AuthorizeAnswer:
        """Decide `POST {auth_url}/oidc/consent` (the consent page's Allow or Deny)."""
        with self._lock:
            answer = oauth.decide(self.world, self.settings, form, self.now())
            status = 400 if answer.location is None else 303
            self._log("POST", path, "none", answer, status, code=answer.error)
            return answer

    def handle_token(
        self, path: str, form: Mapping[str, str] | None, authorization: str | None
    ) -> oauth.TokenAnswer:
        """Decide `POST {auth_url}/oidc/token` (code exchange)."""
        with self._lock:
            answer = oauth.exchange(self.world, self.settings, form, authorization, self.now())
            self._log("POST", path, answer.auth, answer, answer.status, code=answer.error)
            return answer

    def handle_enroll(self, path: str, authorization: str | None) -> access.EnrollAnswer:
        """Decide `POST {auth_url}/api/long-term-access/tokens` (create or rotate)."""
        with self._lock:
            answer = access.enroll(self.world, self.settings, authorization, self.now())
            caller = answer.caller
            status = answer.refusal.status if answer.refusal else answer.status
            code = answer.refusal.code if answer.refusal else None
            self._log("POST", path, caller.auth, caller, status, code=code)
            return answer

    def handle_drop(self, path: str, authorization: str | None) -> None:
        """Decide `DELETE {auth_url}/api/long-term-access/tokens`; the answer is always 204."""
        with self._lock:
            caller = access.drop(self.world, self.settings, authorization)
            self._log("DELETE", path, caller.auth, caller, 204)
