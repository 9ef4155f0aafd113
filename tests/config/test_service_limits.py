"""Settings of the hostile-service limits: ranges of max_wait and request_timeout, proxies."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from lta_worker.config import build_settings, load_settings
from lta_worker.errors import ConfigError

REQUIRED = {
    "LTA_WORKER_SERVICE_BASE_URL": "https://api.example",
    "LTA_WORKER_SERVICE_AUTH_URL": "https://account.example",
    "LTA_WORKER_CLIENT_ID": "client-1",
}


def settings(section: str, **values: Any) -> Any:
    data: dict[str, Any] = {
        "service": {"base_url": "https://api.example", "auth_url": "https://account.example"},
        "client": {"id": "client-1"},
    }
    data[section] = {**data.get(section, {}), **values}
    return build_settings(data)


def test_defaults() -> None:
    """max_wait is an hour, request_timeout a minute, and no proxy is set."""
    s = load_settings(None, REQUIRED)
    assert s.ratelimit.max_wait == timedelta(hours=1)
    assert s.service.request_timeout == timedelta(seconds=60)
    assert (s.service.https_proxy, s.service.no_proxy) == (None, None)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        pytest.param("ratelimit", "max_wait", "0s", id="max-wait-zero"),
        pytest.param("ratelimit", "max_wait", "0.5s", id="max-wait-below-a-second"),
        pytest.param("ratelimit", "max_wait", "25h", id="max-wait-beyond-a-day"),
        pytest.param("ratelimit", "max_wait", "9999999d", id="max-wait-unbounded"),
        pytest.param("service", "request_timeout", "0s", id="request-timeout-zero"),
        pytest.param("service", "request_timeout", "2h", id="request-timeout-beyond-an-hour"),
        pytest.param("service", "https_proxy", "socks5://p:1080", id="proxy-unsupported-scheme"),
        pytest.param("service", "https_proxy", "http://", id="proxy-without-host"),
    ],
)
def test_out_of_range_is_refused_naming_the_key(section: str, key: str, value: str) -> None:
    """A limit of 0, unbounded, or a proxy the worker cannot use: exit 78 naming the key."""
    with pytest.raises(ConfigError) as info:
        settings(section, **{key: value})
    assert info.value.exit_code == 78
    assert f"{section}.{key}" in str(info.value)


@pytest.mark.parametrize(
    ("env", "proxy", "no_proxy"),
    [
        pytest.param({"HTTPS_PROXY": "http://p:3128"}, "http://p:3128", None, id="HTTPS_PROXY"),
        pytest.param(
            {"https_proxy": "http://a:1", "HTTPS_PROXY": "http://b:2"},
            "http://a:1",
            None,
            id="lower-case-first",
        ),
        pytest.param({"ALL_PROXY": "http://p:3128"}, "http://p:3128", None, id="ALL_PROXY"),
        pytest.param({"HTTP_PROXY": "http://p:3128"}, None, None, id="HTTP_PROXY-ignored"),
        pytest.param(
            {"HTTPS_PROXY": "p:3128", "NO_PROXY": "x.example"},
            "http://p:3128",
            "x.example",
            id="bare-host-and-no-proxy",
        ),
        pytest.param(
            {"HTTPS_PROXY": "http://p:1", "LTA_WORKER_SERVICE_HTTPS_PROXY": "http://q:2"},
            "http://q:2",
            None,
            id="own-setting-wins",
        ),
    ],
)
def test_proxies_come_from_the_usual_variables(
    env: dict[str, str], proxy: str | None, no_proxy: str | None
) -> None:
    """Only https proxies are taken from the environment, once, into settings."""
    s = load_settings(None, {**REQUIRED, **env})
    assert (s.service.https_proxy, s.service.no_proxy) == (proxy, no_proxy)


@pytest.mark.parametrize("name", ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"])
def test_a_bad_proxy_from_the_environment_names_the_variable(name: str) -> None:
    """A proxy refused from HTTPS_PROXY & co. names that variable and how to fix it (exit 78)."""
    with pytest.raises(ConfigError) as info:
        load_settings(None, {**REQUIRED, name: "socks5://127.0.0.1:1080"})
    assert info.value.exit_code == 78
    assert info.value.key == "service.https_proxy"
    assert str(info.value).startswith(
        f"service.https_proxy (from the environment variable {name}): expected a proxy URL"
    )
    assert f"unset {name}" in str(info.value.hint)
    assert "set service.https_proxy" in str(info.value.hint)


def test_a_bad_proxy_of_the_worker_own_setting_names_only_the_key() -> None:
    """A proxy refused from LTA_WORKER_SERVICE_HTTPS_PROXY names the key and that variable,
    not HTTPS_PROXY."""
    env = {**REQUIRED, "HTTPS_PROXY": "http://p:1", "LTA_WORKER_SERVICE_HTTPS_PROXY": "socks5://q"}
    with pytest.raises(ConfigError) as info:
        load_settings(None, env)
    assert str(info.value).startswith(
        "service.https_proxy (from the environment variable LTA_WORKER_SERVICE_HTTPS_PROXY): "
        "expected a proxy URL"
    )
    assert " HTTPS_PROXY" not in str(info.value)
