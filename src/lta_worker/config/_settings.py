"""The settings model, one frozen dataclass per TOML table: the one home of every default and
bound (docs/config.md is checked against it). Minimums of 100 ms serve the tests and the demo.
Not slotted: a slotted frozen dataclass costs twice as much to create, at every start.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from lta_worker.config._fields import rule
from lta_worker.domain import EVENT_TYPES, PolicyConfig, ResultEvents, ScheduleMode, StatsMode
from lta_worker.protocol import LONG_TERM_SCOPES, TOKEN_ENDPOINT_PATH

Duration = timedelta  # written as operators do (`90s`, `1h30m`): `domain.parse_duration`
_MS, _S, _M = timedelta(milliseconds=100), timedelta(seconds=1), timedelta(minutes=1)
_H, _D = timedelta(hours=1), timedelta(days=1)
TokenAuth = Literal["client_secret_basic", "client_secret_post"]


def is_loopback_host(host: str) -> bool:
    """True for localhost names and loopback addresses (127.0.0.0/8, ::1)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_url(value: str) -> SplitResult:
    """The parts of a URL httpx can connect to (no control character, a valid port)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("a URL must not hold a control character (tab, newline, ...)")
    parts = urlsplit(value)
    try:
        number = parts.port  # None when absent; 0 to 65535, else ValueError
    except ValueError:
        number = None
    port = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    if port and not (port.isdigit() and number):
        raise ValueError(f"the port must be a number from 1 to 65535 (got {port!r})")
    return parts


def _secure_http_url(value: str) -> SplitResult:
    """The parts of an https URL, or of an http one to a loopback host; ValueError else."""
    parts = _split_url(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ValueError("plain http is refused for a host that is not loopback; use https")
    return parts


def check_service_url(value: str) -> str:
    """Accept https URLs, and http only for loopback hosts; strip a trailing slash."""
    parts = _secure_http_url(value)
    if parts.query or parts.fragment:
        raise ValueError("a service URL takes no query or fragment")
    return value.rstrip("/")


def _proxy(value: str) -> str | None:
    if not value:
        return None
    parts = _split_url(value if "://" in value else f"http://{value}")
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError("expected a proxy URL such as http://proxy.example:3128")
    return parts.geturl()


_SERVICE_URL = rule(check=check_service_url)


@dataclass(frozen=True)
class ServiceSettings:
    """Where the service lives, and how long to wait for it."""

    base_url: str = field(metadata=_SERVICE_URL)
    auth_url: str = field(metadata=_SERVICE_URL)
    token_url: str | None = field(default=None, metadata=_SERVICE_URL)
    connect_timeout: Duration = field(default=5 * _S, metadata=rule(_MS, 5 * _M))
    read_timeout: Duration = field(default=20 * _S, metadata=rule(_MS, 10 * _M))
    # At most 64 MiB: one answer must never fill the memory.
    max_response_bytes: int = field(default=1_048_576, metadata=rule(1024, 64 * 1024 * 1024))
    # The whole of one request (connect, send, every chunk of the body): a body dripping a
    # byte at a time resets `read_timeout` at each chunk, this deadline it does not.
    request_timeout: Duration = field(default=60 * _S, metadata=rule(_S, _H))
    https_proxy: str | None = field(default=None, metadata=rule(check=_proxy))
    no_proxy: str | None = None

    @property
    def token_endpoint(self) -> str:
        """The OAuth token endpoint: `token_url`, or `{auth_url}/oidc/token` by default."""
        return self.token_url or f"{self.auth_url}{TOKEN_ENDPOINT_PATH}"


def _split_list(value: object) -> object:
    """A list from the environment: its items space- or comma-separated."""
    if isinstance(value, str):
        return tuple(s for s in value.replace(",", " ").split() if s)
    return value


def _known_scopes(value: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [s for s in value if s not in LONG_TERM_SCOPES]
    if unknown or not value:
        raise ValueError(f"expected one or both of {', '.join(LONG_TERM_SCOPES)}")
    return tuple(dict.fromkeys(value))


def _redirect(value: str) -> str:
    parts = _split_url(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


@dataclass(frozen=True)
class ClientSettings:
    """The confidential client this worker acts for."""

    id: str = field(metadata=rule(min_length=1))
    secret_file: Path | None = None
    redirect_uri: str = field(
        default="http://127.0.0.1/lta/callback", metadata=rule(check=_redirect)
    )
    scopes: tuple[str, ...] = field(
        default=LONG_TERM_SCOPES, metadata=rule(before=_split_list, check=_known_scopes)
    )
    # How the client authenticates at the token endpoint (a method name, not a secret).
    token_auth: TokenAuth = "client_secret_basic"  # noqa: S105


def _dialect(value: str) -> str:
    if not value.startswith(("sqlite:", "postgresql:", "postgresql+psycopg:", "postgres:")):
        raise ValueError("expected a sqlite:/// or postgresql:// URL")
    return value


@dataclass(frozen=True)
class DatabaseSettings:
    """Where results and tokens are stored; any SQLAlchemy URL."""

    url: str = field(default="sqlite:////var/lib/lta-worker/lta.db", metadata=rule(check=_dialect))


@dataclass(frozen=True)
class CryptoSettings:
    """The key file that encrypts tokens at rest."""

    key_file: Path | None = None


@dataclass(frozen=True)
class PollSettings:
    """How often each user is read, and how a pass behaves."""

    interval: Duration = field(default=15 * _M, metadata=rule(_MS, 365 * _D))
    parked_interval: Duration = field(default=24 * _H, metadata=rule(_MS, 365 * _D))
    concurrency: int = field(default=8, metadata=rule(1, 256))
    max_pass_duration: Duration = field(default=50 * _M, metadata=rule(_MS, _D))
    batch_size: int = field(default=100, metadata=rule(1, 10_000))
    tick: Duration = field(default=_M, metadata=rule(_MS, _D))
    # Not 0s: that breaks the backoff arithmetic.
    backoff_base: Duration = field(default=30 * _S, metadata=rule(_MS, _D))
    breaker_threshold: int = field(default=5, metadata=rule(1, 1000))
    lease_duration: Duration = field(default=5 * _M, metadata=rule(_S, _D))
    schedule: ScheduleMode = "adaptive"
    max_interval: Duration = field(default=24 * _H, metadata=rule(_MS, 365 * _D))
    stats: StatsMode = "on_change"
    stats_max_age: Duration = field(default=24 * _H, metadata=rule(_MS, 365 * _D))
    rate_half_life: Duration = field(default=3 * _D, metadata=rule(_M, 365 * _D))

    def policy(self) -> PolicyConfig:
        """The policy's config (the domain's own object, its fields these of the same names)."""
        names = [f.name for f in fields(PolicyConfig) if f.name != "plan"]
        return PolicyConfig(**{name: getattr(self, name) for name in names})


@dataclass(frozen=True)
class RateLimitSettings:
    """How the shared hourly budget is used."""

    reserve: float = field(default=0.1, metadata=rule(0.0, 0.95))
    fallback_per_hour: float = field(default=60.0, metadata=rule(1.0, 3_600_000.0))
    # No reset, Retry-After or window of the service is trusted beyond this.
    max_wait: Duration = field(default=_H, metadata=rule(_S, _D))


@dataclass(frozen=True)
class RetentionSettings:
    """How long results of revoked or dropped users, and past contents, are kept."""

    after_revocation: Duration = field(default=30 * _D, metadata=rule(timedelta(0), 3650 * _D))
    history: Duration = field(default=365 * _D, metadata=rule(_D, 3650 * _D))


def _webhook_url(value: str) -> str | None:
    if not value:
        return None
    parts = _secure_http_url(value)
    if parts.username or parts.password:
        raise ValueError("a webhook URL takes no user or password; the signature is the proof")
    return value


def _known_events(value: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [e for e in value if e not in EVENT_TYPES]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} is not an event type; expected some of "
            + ", ".join(EVENT_TYPES)
        )
    if not value:
        raise ValueError("must name at least one event type (unset webhook.url to send none)")
    return tuple(dict.fromkeys(value))


@dataclass(frozen=True)
class WebhookSettings:
    """Where user state changes and new results are POSTed (Standard Webhooks)."""

    url: str | None = field(default=None, metadata=rule(check=_webhook_url))
    secret_file: Path | None = None
    max_age: Duration = field(default=3 * _D, metadata=rule(_M, 30 * _D))
    keep_dead: Duration = field(default=30 * _D, metadata=rule(_H, 3650 * _D))
    timeout: Duration = field(default=10 * _S, metadata=rule(_S, 5 * _M))
    interval: Duration = field(default=5 * _S, metadata=rule(_MS, _H))
    events: tuple[str, ...] = field(
        default=EVENT_TYPES, metadata=rule(before=_split_list, check=_known_events)
    )
    include_content: bool = False

    @property
    def result_events(self) -> ResultEvents:
        """What storage writes of `result.changed`: nothing when no receiver gets it."""
        if self.url is None or "result.changed" not in self.events:
            return "off"
        return "content" if self.include_content else "hash"


@dataclass(frozen=True)
class LogSettings:
    """Log level and rendering; `read_level` is the level of the per-read `poll.read` line."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    read_level: Literal["debug", "info"] = "info"


def parse_listen(value: str) -> tuple[str, int]:
    """Split a listen address `HOST:PORT` (`[::1]:PORT` for IPv6) into host and port.

    Raises:
        ValueError: not HOST:PORT with a port from 1 to 65535.
    """
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]") if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT, such as 127.0.0.1:8080 or [::1]:8080")
    return host, int(port)


def _listen(value: str) -> str | None:
    if not value:
        return None
    parse_listen(value)
    return value.strip()


@dataclass(frozen=True)
class MetricsSettings:
    """Prometheus metrics: served by `serve` (`listen`) or written by `run` (`textfile`)."""

    listen: str | None = field(default=None, metadata=rule(check=_listen))
    textfile: Path | None = None


@dataclass(frozen=True)
class ServeSettings:
    """Long-running service mode."""

    grace_period: Duration = field(default=10 * _S, metadata=rule(timedelta(0), 15 * _M))
    # Not 0s: a busy loop.
    heartbeat: Duration = field(default=30 * _S, metadata=rule(_MS, _H))
    maintenance_interval: Duration = field(default=_H, metadata=rule(_S, 7 * _D))


def _public_url(value: str) -> str | None:
    return check_service_url(value) if value else None


def _return_url(value: str) -> str | None:
    if not value:
        return None
    parts = _split_url(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.fragment:
        raise ValueError(f"{value!r} is not an http(s) URL without a fragment")
    return value


@dataclass(frozen=True)
class EnrollSettings:
    """Browser enrollment: signed links and the flow `serve` hosts when `listen` is set."""

    listen: str | None = field(default=None, metadata=rule(check=_listen))
    public_url: str | None = field(default=None, metadata=rule(check=_public_url))
    link_key_file: Path | None = None
    return_url: str | None = field(default=None, metadata=rule(check=_return_url))


@dataclass(frozen=True)
class Settings:
    """Every setting of lta-worker; built by `config.load_settings`."""

    service: ServiceSettings
    client: ClientSettings
    database: DatabaseSettings = DatabaseSettings()
    crypto: CryptoSettings = CryptoSettings()
    poll: PollSettings = PollSettings()
    ratelimit: RateLimitSettings = RateLimitSettings()
    retention: RetentionSettings = RetentionSettings()
    log: LogSettings = LogSettings()
    serve: ServeSettings = ServeSettings()
    enroll: EnrollSettings = EnrollSettings()
    metrics: MetricsSettings = MetricsSettings()
    webhook: WebhookSettings = WebhookSettings()


SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(Settings))
