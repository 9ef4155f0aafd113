"""Settings: typed, frozen, validated; from a TOML file, the environment and secret files
(nothing outside this package reads the environment for settings)."""

from __future__ import annotations

from lta_worker.config._fields import field_types, ranges, read_section
from lta_worker.config._loader import (
    build_settings,
    config_path,
    key_file_path,
    load_settings,
    read_client_secret,
    read_link_keys,
    read_webhook_secret,
    start_path,
    start_url,
)
from lta_worker.config._settings import (
    ClientSettings,
    PollSettings,
    RateLimitSettings,
    ServiceSettings,
    Settings,
    WebhookSettings,
    is_loopback_host,
    parse_listen,
)
from lta_worker.domain import format_duration, parse_duration
from lta_worker.protocol import LATEST_CHANGE_SCOPE, LONG_TERM_SCOPES, STATS_SCOPE

__all__ = [
    "LATEST_CHANGE_SCOPE",
    "LONG_TERM_SCOPES",
    "STATS_SCOPE",
    "ClientSettings",
    "PollSettings",
    "RateLimitSettings",
    "ServiceSettings",
    "Settings",
    "WebhookSettings",
    "build_settings",
    "config_path",
    "field_types",
    "format_duration",
    "is_loopback_host",
    "key_file_path",
    "load_settings",
    "parse_duration",
    "parse_listen",
    "ranges",
    "read_client_secret",
    "read_link_keys",
    "read_section",
    "read_webhook_secret",
    "start_path",
    "start_url",
]
