"""Proxy settings: taken from the usual environment variables, refused naming their source
(the ranges of max_wait and request_timeout: test_ranges.py)."""

from __future__ import annotations

import pytest

from lta_worker.config import build_settings, load_settings
from lta_worker.errors import ConfigError
from support.configs import with_setting

REQUIRED = {
    "LTA_WORKER_SERVICE_BASE_URL": "https://api.example",
    "LTA_WORKER_SERVICE_AUTH_URL": "https://account.example",
    "LTA_WORKER_CLIENT_ID": "client-1",
}


@pytest.mark.parametrize("value", ["socks5://p:1080", "http://"], ids=["scheme", "no-host"])
def test_a_proxy_the_worker_cannot_use_is_refused(value: str) -> None:
    """An https_proxy of another scheme or without a host: exit 78 naming the key."""
    with pytest.raises(ConfigError) as info:
        build_settings(with_setting("service.https_proxy", value))
    assert info.value.exit_code == 78
    assert "service.https_proxy" in str(info.value)


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
    """A proxy refused from LTA_WORKER_SERVICE_HTTPS_PROXY names that variable, not HTTPS_PROXY."""
    env = {**REQUIRED, "HTTPS_PROXY": "http://p:1", "LTA_WORKER_SERVICE_HTTPS_PROXY": "socks5://q"}
    with pytest.raises(ConfigError) as info:
        load_settings(None, env)
    assert str(info.value).startswith(
        "service.https_proxy (from the environment variable LTA_WORKER_SERVICE_HTTPS_PROXY): "
        "expected a proxy URL"
    )
    assert " HTTPS_PROXY" not in str(info.value)
