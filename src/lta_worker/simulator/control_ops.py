"""The operator's and the user's side (spec 3) and the knobs, as methods of `Simulator`."""

from __future__ import annotations

import threading
from dataclasses import fields, replace
from datetime import datetime, timedelta
from typing import Any

from lta_worker.simulator import budget
from lta_worker.simulator.responses import FaultPlan, FaultRule
from lta_worker.simulator.state import (
    ENDPOINTS,
    ERROR_STYLES,
    LONG_TERM_SCOPES,
    Client,
    Clock,
    Consent,
    ManualClock,
    SimSettings,
    User,
    World,
    isoformat,
)


class ControlError(ValueError):
    """A control operation that cannot be done; `status` is its HTTP answer (400, 404, 409)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ControlOps:
    """Control operations, mixed into `Simulator` (which provides the attributes below)."""

    clock: Clock
    settings: SimSettings
    faults: FaultPlan
    world: World
    _lock: threading.RLock

    def now(self) -> datetime:
        """The simulator's current time."""
        return self.clock.now()

    def _user(self, user: str) -> User:
        record = self.world.users.get(user)
        if record is None or record.deleted:
            raise ControlError(f"no user {user!r}; create it with POST /_sim/users", 404)
        return record

    def _client(self, client: str) -> Client:
        record = self.world.clients.get(client)
        if record is None:
            raise ControlError(f"no client {client!r}", 404)
        return record

    def add_client(
        self,
        client: str,
        secret: str,
        *,
        long_term: bool = False,
        redirect_uris: list[str] | None = None,
        scopes: list[str] | None = None,
    ) -> None:
        """Register (or replace) a confidential client; the secret must not contain a dot."""
        if not client or not secret or "." in secret:
            raise ControlError("a client needs an id and a secret without '.'")
        with self._lock:
            record = Client(id=client, secret=secret, long_term=long_term)
            if redirect_uris is not None:
                record.redirect_uris = set(redirect_uris)
            if scopes is not None:
                record.enabled_scopes = set(_long_term_scopes(scopes))
            self.world.clients[client] = record

    def client_info(self, client: str) -> dict[str, Any]:
        """A client's public description (its secret is never shown)."""
        with self._lock:
            record = self._client(client)
            return {
                "id": record.id,
                "long_term": record.long_term,
                "scopes": sorted(record.enabled_scopes),
                "redirect_uris": sorted(record.redirect_uris),
                "tokens": sum(
                    1 for g in self.world.grants.values() if g.client == client and not g.revoked
                ),
            }

    def client_secret(self, client: str) -> str:
        """The secret of a registered client (for demos and tests of the client side)."""
        with self._lock:
            return self._client(client).secret

    def add_redirect_uri(self, client: str, uri: str) -> None:
        """Register one more redirect address on a client."""
        with self._lock:
            self._client(client).redirect_uris.add(uri)

    def withdraw_mode(self, client: str) -> int:
        """The operator withdraws long term access: every token of the client is revoked."""
        with self._lock:
            self._client(client).long_term = False
            return self.world.revoke_all(lambda g: g.client == client)

    def reopen_mode(self, client: str) -> None:
        """The operator opens (again) long term access on a client; revoked tokens stay so."""
        with self._lock:
            self._client(client).long_term = True

    def set_client_scopes(self, client: str, scopes: list[str]) -> None:
        """Set the long term scopes the client owner leaves ticked (others give 403)."""
        with self._lock:
            self._client(client).enabled_scopes = set(_long_term_scopes(scopes))

    def add_user(
        self,
        user: str,
        *,
        linked: bool = True,
        last_sync_age_days: float | None = 1.0,
        payloads: dict[str, Any] | None = None,
    ) -> None:
        """Create (or re-create) an account; `last_sync_age_days=None` means never synced."""
        if not user:
            raise ControlError("a user needs an id")
        with self._lock:
            now = self.now()
            last = None if last_sync_age_days is None else now - timedelta(days=last_sync_age_days)
            record = User(id=user, linked=linked, last_sync_at=last)
            self.world.users[user] = record
            for endpoint, payload in (payloads or {}).items():
                self._set_payload(record, endpoint, payload)

    def user_info(self, user: str) -> dict[str, Any]:
        """An account as its owner would see it, including the Connected services tab."""
        with self._lock:
            record = self._user(user)
            grants = [
                {
                    "client": g.client,
                    "scopes": list(g.scopes),
                    "granted_at": isoformat(g.created_at),
                    "last_used_at": isoformat(g.last_used_at) if g.last_used_at else None,
                    "state": "revoked" if g.revoked else "active",
                }
                for g in self.world.grants.values()
                if g.user == user
            ]
            last = record.last_sync_at
            return {
                "user": user,
                "linked": record.linked,
                "last_sync_at": isoformat(last) if last else None,
                "payloads": dict(record.payloads),
                "connected_services": grants,
            }

    def queue_consent(
        self, user: str, scopes: list[str] | None = None, *, deny: bool = False
    ) -> int:
        """Queue who approves the next consent and the scopes they leave ticked; how many queued."""
        if not user:
            raise ControlError("a consent needs a user")
        with self._lock:
            self.world.consents.append(
                Consent(user=user, scopes=None if scopes is None else tuple(scopes), deny=deny)
            )
            return len(self.world.consents)

    def revoke(self, user: str, client: str | None = None) -> int:
        """The user revokes their long term access (to one client, or to all) from the account."""
        with self._lock:
            self._user(user)
            return self.world.revoke_all(
                lambda g: g.user == user and (client is None or g.client == client)
            )

    def delete_account(self, user: str) -> int:
        """The user deletes their account: every long term access and user token goes."""
        with self._lock:
            self._user(user).deleted = True
            revoked = self.world.revoke_all(lambda g: g.user == user)
            for key in [k for k, t in self.world.user_tokens.items() if t.user == user]:
                del self.world.user_tokens[key]
            return revoked

    def set_sync(
        self, user: str, *, linked: bool | None = None, last_sync_age_days: float | None = None
    ) -> None:
        """Link or unlink the user's cloud sync, and/or set how long ago it last synced."""
        with self._lock:
            record = self._user(user)
            if linked is not None:
                record.linked = linked
                if linked and record.last_sync_at is None and last_sync_age_days is None:
                    record.last_sync_at = self.now()
            if last_sync_age_days is not None:
                if last_sync_age_days < 0:
                    raise ControlError("last_sync_age_days cannot be negative")
                record.last_sync_at = self.now() - timedelta(days=last_sync_age_days)

    def set_payload(self, user: str, endpoint: str, payload: Any) -> None:
        """Set what a read returns; `None` for latest-change means nothing recorded (404)."""
        with self._lock:
            self._set_payload(self._user(user), endpoint, payload)

    @staticmethod
    def _set_payload(record: User, endpoint: str, payload: Any) -> None:
        if endpoint not in ENDPOINTS:
            raise ControlError(f"unknown endpoint {endpoint!r}; expected one of {ENDPOINTS}")
        if payload is None and endpoint != "latest-change":
            raise ControlError("only latest-change can have nothing recorded")
        record.payloads[endpoint] = payload

    def configure(self, **changes: Any) -> SimSettings:
        """Change settings (names of `SimSettings`); a new window length resets the counts."""
        known = {f.name for f in fields(SimSettings)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ControlError(f"unknown settings: {', '.join(unknown)}")
        with self._lock:
            candidate = replace(self.settings, **changes)
            _validate(candidate)
            if candidate.window != self.settings.window:
                self.world.budgets.clear()
            self.settings = candidate
            return candidate

    def consume_budget(self, client: str, count: int = 1) -> int:
        """Count `count` requests of the client's other API traffic; returns what remains."""
        with self._lock:
            self._client(client)
            s, ts = self.settings, self.now().timestamp()
            try:
                window = budget.spend(self.world.budgets.get(client), ts, s.window, count)
            except ValueError as exc:
                raise ControlError(str(exc)) from exc
            self.world.budgets[client] = window
            return budget.quota(window, ts, s.budget, s.window).remaining

    def budget_of(self, client: str) -> budget.Quota:
        """The budget figures the client's next answer would report (before counting it)."""
        with self._lock:
            s, ts = self.settings, self.now().timestamp()
            return budget.quota(self.world.budgets.get(client), ts, s.budget, s.window)

    def inject_fault(
        self,
        kind: str,
        *,
        rate: float | None = None,
        count: int | None = None,
        delay: float | None = None,
    ) -> FaultRule:
        """Add a fault on the reads: on the next `count` reads, or with probability `rate`."""
        with self._lock:
            try:
                return self.faults.add(kind, rate=rate, count=count, delay=delay)
            except ValueError as exc:
                raise ControlError(str(exc)) from exc

    def seed_faults(self, seed: int | None) -> None:
        """Restart the fault generator from `seed`."""
        with self._lock:
            self.faults.reseed(seed)

    def clear_faults(self) -> None:
        """Remove every fault rule (the generator keeps its position)."""
        with self._lock:
            self.faults.rules.clear()

    def _manual(self) -> ManualClock:
        if not isinstance(self.clock, ManualClock):
            raise ControlError(
                "the simulator runs on the real clock; start it with a ManualClock", 409
            )
        return self.clock

    def advance(self, seconds: float) -> datetime:
        """Move a manual clock forward by `seconds` (ControlError 409 on the real clock)."""
        with self._lock:
            return self._manual().advance(seconds)

    def set_time(self, when: datetime) -> datetime:
        """Set a manual clock to `when` (ControlError 409 on the real clock)."""
        with self._lock:
            return self._manual().set(when)


def _long_term_scopes(scopes: list[str]) -> list[str]:
    unknown = [s for s in scopes if s not in LONG_TERM_SCOPES]
    if unknown:
        raise ControlError(f"unknown long term scopes: {', '.join(unknown)}")
    return scopes


def _validate(s: SimSettings) -> None:
    if not isinstance(s.budget, int) or s.budget < 0:
        raise ControlError("budget must be a whole number >= 0")
    if not isinstance(s.window, int) or s.window < 1:
        raise ControlError("window must be a whole number of seconds >= 1")
    if s.header_format not in budget.HEADER_FORMATS:
        raise ControlError(f"header_format must be one of {budget.HEADER_FORMATS}")
    if s.error_style not in ERROR_STYLES:
        raise ControlError(f"error_style must be one of {ERROR_STYLES}")
    if not isinstance(s.enroll_status, int) or not 200 <= s.enroll_status <= 299:
        raise ControlError("enroll_status must be a 2xx status")
    if s.enroll_status in {204, 205}:
        raise ControlError("enroll_status must allow a body (not 204 or 205)")
    if s.after_delete not in ("plain", "revoked"):
        raise ControlError("after_delete must be 'plain' or 'revoked'")
