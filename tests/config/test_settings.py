"""Settings: TOML + environment + systemd directories, errors that name the key; proxy settings
taken from the usual environment variables, refused naming their source."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from lta_worker.config import build_settings, key_file_path, load_settings, read_client_secret
from lta_worker.errors import ConfigError
from support.configs import with_setting
from support.process import write_private

MINIMAL = """
[service]
base_url = "https://api.example"
auth_url = "https://account.example"
[client]
id = "client-1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    """LTA_WORKER_<SECTION>_<KEY> beats the TOML file (underscores in keys included), which
    LTA_WORKER_CONFIG names when --config is not given."""
    env = {
        "LTA_WORKER_CONFIG": str(write(tmp_path, MINIMAL)),
        "LTA_WORKER_POLL_PARKED_INTERVAL": "12h",
        "LTA_WORKER_POLL_CONCURRENCY": "3",
        "LTA_WORKER_CLIENT_SCOPES": "cloud-sync.permanent.stats",
    }
    s = load_settings(None, env=env)
    assert s.client.id == "client-1"
    assert s.poll.parked_interval == timedelta(hours=12)
    assert s.poll.concurrency == 3
    assert s.client.scopes == ("cloud-sync.permanent.stats",)


def test_derived_defaults(tmp_path: Path) -> None:
    """The token endpoint sits under auth_url; systemd's directories supply the file paths."""
    env = {"CREDENTIALS_DIRECTORY": "/run/credentials/x", "STATE_DIRECTORY": "/var/lib/lta"}
    s = load_settings(write(tmp_path, MINIMAL), env=env)
    assert s.service.token_endpoint == "https://account.example/oidc/token"
    assert s.client.secret_file == Path("/run/credentials/x/client-secret")
    assert key_file_path(s) == Path("/run/credentials/x/token-keys")
    assert s.database.url == "sqlite:////var/lib/lta/lta.db"


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"poll": {"interval": "soon"}}, "poll.interval"),
        ({"service": {"base_url": "http://api.example"}}, "service.base_url"),
        ({"service": {"auth_url": "ftp://x"}}, "service.auth_url"),
        ({"client": {"scopes": ["cloud-sync.history"]}}, "client.scopes"),
        ({"client": {"id": ""}}, "client.id"),
        ({"database": {"url": "mysql://x"}}, "database.url"),
        ({"log": {"level": "loud"}}, "log.level"),
        ({"webhook": {"events": ["user.revoked", "result.changd"]}}, "webhook.events"),
        ({"webhook": {"events": []}}, "webhook.events"),
        ({"webhook": {"events": 5}}, "webhook.events"),
        ({"client": None}, "client"),
        ({"client": {"id": None}}, "client.id"),
        ({"service": {"base_url": None}}, "service.base_url"),
        ({"service": {"auth_url": "http://10.0.0.8/auth"}}, "service.auth_url"),
        ({"service": {"token_url": "http://account.example/oidc/token"}}, "service.token_url"),
        ({"webhook": {"url": "http://hooks.example/lta"}}, "webhook.url"),
        ({"client": {"redirect_uri": "callback"}}, "client.redirect_uri"),
        ({"database": {"url": "lta.db"}}, "database.url"),
        ({"database": {"url": "postgresql+psycopg2://u@h/db"}}, "database.url"),
        ({"polling": {"interval": "1h"}}, "polling"),
        ({"service": {"https_proxy": "socks5://p:1080"}}, "service.https_proxy"),
        ({"service": {"https_proxy": "http://"}}, "service.https_proxy"),
    ],
)
def test_a_broken_key_is_named(patch: dict[str, object], key: str) -> None:
    """Each broken setting raises ConfigError (exit 78) whose message names the key (None: the
    key left out; through `run`, one JSON line: tests/reliability/test_bad_input.py)."""
    data: dict[str, object] = with_setting("client.id", "c")
    for section, values in patch.items():
        if values is None:
            data.pop(section)
        else:
            merged = {**data.get(section, {}), **values}  # type: ignore[dict-item]
            data[section] = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        build_settings(data)
    assert info.value.key == key
    assert str(info.value).startswith(key)
    assert info.value.exit_code == 78


def test_plain_http_is_refused_beyond_loopback() -> None:
    """Plain http is refused for any host but 127.0.0.1, ::1 and localhost (taken: below)."""
    with pytest.raises(ConfigError, match="loopback"):
        build_settings(with_setting("service.base_url", "http://10.0.0.1"))


def test_invalid_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    """An unreadable config is a ConfigError naming the file and what is wrong with it."""
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"{missing}.*does not exist"):
        load_settings(missing, env={})
    with pytest.raises(ConfigError, match=f"{tmp_path / 'config.toml'}.*not valid TOML"):
        load_settings(write(tmp_path, "[service\nbase_url = "), env={})
    huge = MINIMAL + "[poll]\ninterval = 1" + "0" * 5000 + "\n"  # beyond Python's digit limit
    with pytest.raises(ConfigError, match="not valid TOML: a number has too many digits"):
        load_settings(write(tmp_path, huge), env={})


def test_client_secret_is_read_from_its_file_and_masked(tmp_path: Path) -> None:
    """The client secret comes from client.secret_file, never shows in a repr, and its file
    missing is a ConfigError naming client.secret_file."""
    secret = write_private(tmp_path / "secret", "s3cr3t-value\n")
    s = load_settings(write(tmp_path, MINIMAL + f'secret_file = "{secret}"\n'), env={})
    value = read_client_secret(s)
    assert value.reveal() == "s3cr3t-value"
    assert "s3cr3t" not in repr(value) and "s3cr3t" not in f"{value}"
    secret.unlink()
    with pytest.raises(ConfigError) as info:
        read_client_secret(s)
    assert info.value.key == "client.secret_file"


URL_KEYS = [
    "service.base_url",
    "service.auth_url",
    "service.token_url",
    "service.https_proxy",
    "client.redirect_uri",
    "enroll.public_url",
    "enroll.return_url",
    "webhook.url",
]


@pytest.mark.parametrize("key", URL_KEYS)
@pytest.mark.parametrize("port", ["99999", "65536", "0", "abc", "-1", "+1", "1_0", "1:2", "\uff18"])
def test_a_url_with_a_bad_port_is_refused_naming_the_key(key: str, port: str) -> None:
    """A URL setting whose port is not a number from 1 to 65535 is refused at load."""
    with pytest.raises(ConfigError) as info:
        build_settings(with_setting(key, f"https://h.example:{port}/x"))
    assert info.value.key == key
    assert str(info.value) == f"{key}: the port must be a number from 1 to 65535 (got {port!r})"


@pytest.mark.parametrize("key", URL_KEYS)
@pytest.mark.parametrize("url", ["https://h.exa\tmple", "https://h.example/\x00", "https://h\x7f"])
def test_a_url_with_a_control_character_is_refused(key: str, url: str) -> None:
    """A URL setting holding a control character (which httpx refuses) is refused at load."""
    with pytest.raises(ConfigError, match="control character") as info:
        build_settings(with_setting(key, url))
    assert info.value.key == key


@pytest.mark.parametrize(
    "url",
    [
        "https://h.example:1",
        "https://h.example:65535/x",
        "http://[::1]:8080",
        "http://127.0.0.1:",
        "http://localhost/prefix/",
    ],
)
def test_a_url_with_a_valid_port_is_taken(url: str) -> None:
    """Ports 1 and 65535, an IPv6 host with a port and an empty port are accepted, plain http
    on loopback too."""
    s = build_settings({"service": {"base_url": url, "auth_url": url}, "client": {"id": "c"}})
    assert s.service.base_url == url.rstrip("/")
    assert httpx.URL(url).port in (None, 1, 65535, 8080)  # httpx takes it too


@pytest.mark.parametrize(
    ("name", "value", "key"),
    [
        ("LTA_WORKER_POLL_INTERVALL", "1h", "poll.intervall"),
        ("LTA_WORKER_POLL_CONCURRENCY", "many", "poll.concurrency"),
        ("LTA_WORKER_POLL_INTERVAL", "0s", "poll.interval"),
        ("LTA_WORKER_POLL_INTERVAL", "every now and then", "poll.interval"),
    ],
)
def test_an_environment_problem_names_its_variable(
    tmp_path: Path, name: str, value: str, key: str
) -> None:
    """A misspelt or bad `LTA_WORKER_*` variable: the error names the key and the variable."""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, MINIMAL), env={name: value})
    assert info.value.key == key
    assert name in str(info.value)


REQUIRED = {
    "LTA_WORKER_SERVICE_BASE_URL": "https://api.example",
    "LTA_WORKER_SERVICE_AUTH_URL": "https://account.example",
    "LTA_WORKER_CLIENT_ID": "client-1",
}


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
