"""The settings model: typed, frozen and validated; one section per TOML table.

Nothing here reads files or the environment: `config.loader` does, and builds a `Settings`.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from lta_worker.domain import LONG_TERM_SCOPES, ScheduleMode, StatsMode, parse_duration

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
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


def check_service_url(value: str) -> str:
    """Accept https URLs, and http only for loopback hosts; strip a trailing slash."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ValueError("plain http is refused for a host that is not loopback; use https")
    if parts.query or parts.fragment:
        raise ValueError("a service URL takes no query or fragment")
    return value.rstrip("/")


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceSettings(_Section):
    """Where the service lives, and how long to wait for it."""

    base_url: str
    auth_url: str
    token_url: str | None = None
    connect_timeout: Duration = timedelta(seconds=5)
    read_timeout: Duration = timedelta(seconds=20)
    max_response_bytes: int = Field(default=1_048_576, ge=1024)
    # The whole of one request (connect, send, every chunk of the body): a body dripping a
    # byte at a time resets `read_timeout` at each chunk, this deadline it does not.
    request_timeout: Duration = timedelta(seconds=60)
    # Proxy for https requests only (a CONNECT tunnel keeps TLS end to end); the loader
    # fills both from HTTPS_PROXY / ALL_PROXY and NO_PROXY when the file does not set them.
    https_proxy: str | None = None
    no_proxy: str | None = None

    _urls = field_validator("base_url", "auth_url", "token_url")(
        lambda v: None if v is None else check_service_url(v)
    )

    @field_validator("request_timeout")
    @classmethod
    def _request_timeout(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(hours=1):
            raise ValueError("must be between 1s and 1h")
        return value

    @field_validator("https_proxy")
    @classmethod
    def _proxy(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value if "://" in value else f"http://{value}")
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError("expected a proxy URL such as http://proxy.example:3128")
        return parts.geturl()

    @property
    def token_endpoint(self) -> str:
        """The OAuth token endpoint: `token_url`, or `{auth_url}/oidc/token` by default."""
        return self.token_url or f"{self.auth_url}/oidc/token"


class ClientSettings(_Section):
    """The confidential client this worker acts for."""

    id: str = Field(min_length=1)
    secret_file: Path | None = None
    redirect_uri: str = "http://127.0.0.1/lta/callback"
    scopes: tuple[str, ...] = LONG_TERM_SCOPES
    # How the client authenticates at the token endpoint (a method name, not a secret).
    token_auth: TokenAuth = "client_secret_basic"  # noqa: S105

    @field_validator("scopes", mode="before")
    @classmethod
    def _split_scopes(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(s for s in value.replace(",", " ").split() if s)
        return value

    @field_validator("scopes")
    @classmethod
    def _known_scopes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in value if s not in LONG_TERM_SCOPES]
        if unknown or not value:
            raise ValueError(f"expected one or both of {', '.join(LONG_TERM_SCOPES)}")
        return tuple(dict.fromkeys(value))

    @field_validator("redirect_uri")
    @classmethod
    def _redirect(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value


class DatabaseSettings(_Section):
    """Where results and tokens are stored; any SQLAlchemy URL."""

    url: str = "sqlite:////var/lib/lta-worker/lta.db"

    @field_validator("url")
    @classmethod
    def _dialect(cls, value: str) -> str:
        if not value.startswith(("sqlite:", "postgresql:", "postgresql+psycopg:", "postgres:")):
            raise ValueError("expected a sqlite:/// or postgresql:// URL")
        return value


class CryptoSettings(_Section):
    """The key file that encrypts tokens at rest."""

    key_file: Path | None = None


class PollSettings(_Section):
    """How often each user is read, and how a pass behaves."""

    interval: Duration = timedelta(hours=1)
    parked_interval: Duration = timedelta(hours=24)
    concurrency: int = Field(default=8, ge=1, le=256)
    max_pass_duration: Duration = timedelta(minutes=50)
    batch_size: int = Field(default=100, ge=1, le=10_000)
    tick: Duration = timedelta(minutes=1)
    backoff_base: Duration = timedelta(seconds=30)
    breaker_threshold: int = Field(default=5, ge=1)
    lease_duration: Duration = timedelta(minutes=5)
    # The freshness schedule (domain `freshness`; docs/config.md says what each trades).
    schedule: ScheduleMode = "fixed"
    max_interval: Duration = timedelta(hours=24)
    stats: StatsMode = "always"
    stats_max_age: Duration = timedelta(hours=24)
    rate_half_life: Duration = timedelta(days=3)

    @field_validator(
        "interval",
        "parked_interval",
        "tick",
        "lease_duration",
        "max_pass_duration",
        "max_interval",
        "stats_max_age",
        "rate_half_life",
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than 0s")
        return value


class RateLimitSettings(_Section):
    """How the shared hourly budget is used."""

    reserve: float = Field(default=0.1, ge=0.0, lt=1.0)
    fallback_per_hour: float = Field(default=60.0, gt=0.0)
    # No reset, Retry-After or window of the service is trusted beyond this.
    max_wait: Duration = timedelta(hours=1)

    @field_validator("max_wait")
    @classmethod
    def _max_wait(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(hours=24):
            raise ValueError("must be between 1s and 24h")
        return value


class RetentionSettings(_Section):
    """How long results of revoked or dropped users, and past contents, are kept."""

    after_revocation: Duration = timedelta(days=30)
    # Past contents (the history) older than this are pruned, the newest of each kept.
    history: Duration = timedelta(days=365)


class WebhookSettings(_Section):
    """Where user state changes are POSTed (Standard Webhooks); off without `url`."""

    url: str | None = None
    secret_file: Path | None = None
    # Undelivered events older than this are dead-lettered (kept `keep_dead`, then deleted).
    max_age: Duration = timedelta(days=3)
    keep_dead: Duration = timedelta(days=30)
    # The whole of one delivery (connect, send, answer), and how often `serve` delivers.
    timeout: Duration = timedelta(seconds=10)
    interval: Duration = timedelta(seconds=5)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ValueError("plain http is refused for a host that is not loopback; use https")
        if parts.username or parts.password:
            raise ValueError("a webhook URL takes no user or password; the signature is the proof")
        return value


class LogSettings(_Section):
    """Log level and rendering; `read_level` is the level of the per-read `poll.read` line
    alone (`debug` turns it down under `level = "info"`, keeping `pass.finished` and state
    changes)."""

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


class MetricsSettings(_Section):
    """Prometheus metrics: served by `serve` (`listen`) or written by `run` (`textfile`)."""

    listen: str | None = None
    textfile: Path | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value:
            parse_listen(value)
        return value or None


class ServeSettings(_Section):
    """Long-running service mode."""

    grace_period: Duration = timedelta(seconds=10)
    heartbeat: Duration = timedelta(seconds=30)
    maintenance_interval: Duration = timedelta(hours=1)


class EnrollSettings(_Section):
    """Browser enrollment: signed links and the flow `serve` hosts when `listen` is set."""

    listen: str | None = None
    public_url: str | None = None
    link_key_file: Path | None = None
    return_url: str | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if not value:
            return None
        parse_listen(value)
        return value.strip()

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return check_service_url(value) if value else None

    @field_validator("return_url")
    @classmethod
    def _return_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname or parts.fragment:
            raise ValueError(f"{value!r} is not an http(s) URL without a fragment")
        return value


class Settings(_Section):
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


SECTIONS: tuple[str, ...] = tuple(Settings.model_fields)
