"""Settings: TOML + environment + systemd directories, errors that name the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from lta_worker.config import build_settings, load_settings, read_client_secret
from lta_worker.config._loader import key_file_path
from lta_worker.errors import ConfigError

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


def test_minimal_config_gets_documented_defaults(tmp_path: Path) -> None:
    """A config with only the required keys gets DESIGN.md's defaults."""
    s = load_settings(write(tmp_path, MINIMAL), env={})
    assert s.poll.interval == timedelta(hours=1)
    assert s.poll.parked_interval == timedelta(hours=24)
    assert s.poll.concurrency == 8
    assert s.poll.max_pass_duration == timedelta(minutes=50)
    assert s.ratelimit.reserve == pytest.approx(0.1)
    assert s.retention.after_revocation == timedelta(days=30)
    assert s.service.token_endpoint == "https://account.example/oidc/token"
    assert s.client.scopes == (
        "cloud-sync.permanent.latest-change",
        "cloud-sync.permanent.stats",
    )


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    """LTA_WORKER_<SECTION>_<KEY> beats the TOML file, underscores in keys included."""
    env = {
        "LTA_WORKER_POLL_PARKED_INTERVAL": "12h",
        "LTA_WORKER_POLL_CONCURRENCY": "3",
        "LTA_WORKER_CLIENT_SCOPES": "cloud-sync.permanent.stats",
    }
    s = load_settings(write(tmp_path, MINIMAL), env=env)
    assert s.poll.parked_interval == timedelta(hours=12)
    assert s.poll.concurrency == 3
    assert s.client.scopes == ("cloud-sync.permanent.stats",)


def test_config_path_comes_from_the_environment(tmp_path: Path) -> None:
    """LTA_WORKER_CONFIG names the file when --config is not given."""
    path = write(tmp_path, MINIMAL)
    s = load_settings(None, env={"LTA_WORKER_CONFIG": str(path)})
    assert s.client.id == "client-1"


def test_systemd_directories_give_default_paths(tmp_path: Path) -> None:
    """Under systemd, credentials and the state directory supply the file defaults."""
    env = {"CREDENTIALS_DIRECTORY": "/run/credentials/x", "STATE_DIRECTORY": "/var/lib/lta"}
    s = load_settings(write(tmp_path, MINIMAL), env=env)
    assert s.client.secret_file == Path("/run/credentials/x/client-secret")
    assert key_file_path(s) == Path("/run/credentials/x/token-keys")
    assert s.database.url == "sqlite:////var/lib/lta/lta.db"


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"poll": {"interval": "soon"}}, "poll.interval"),
        ({"poll": {"concurrency": 0}}, "poll.concurrency"),
        ({"poll": {"intervall": "1h"}}, "poll.intervall"),
        ({"ratelimit": {"reserve": 1.5}}, "ratelimit.reserve"),
        ({"service": {"base_url": "http://api.example"}}, "service.base_url"),
        ({"service": {"auth_url": "ftp://x"}}, "service.auth_url"),
        ({"client": {"scopes": ["cloud-sync.history"]}}, "client.scopes"),
        ({"client": {"id": ""}}, "client.id"),
        ({"database": {"url": "mysql://x"}}, "database.url"),
        ({"log": {"level": "loud"}}, "log.level"),
        ({"client": None}, "client"),
    ],
)
def test_a_broken_key_is_named(patch: dict[str, object], key: str) -> None:
    """Each broken setting raises ConfigError (exit 78) whose message names the key."""
    data: dict[str, object] = {
        "service": {"base_url": "https://api.example", "auth_url": "https://a.example"},
        "client": {"id": "c"},
    }
    for section, values in patch.items():
        if values is None:
            data.pop(section)
        else:
            data[section] = {**data.get(section, {}), **values}  # type: ignore[dict-item]
    with pytest.raises(ConfigError) as info:
        build_settings(data)
    assert info.value.key == key
    assert str(info.value).startswith(key)
    assert info.value.exit_code == 78


def test_http_is_allowed_for_loopback_only() -> None:
    """Plain http passes for 127.0.0.1, ::1 and localhost, and is refused elsewhere."""
    for url in ("http://127.0.0.1:8080", "http://[::1]:9", "http://localhost/prefix/"):
        s = build_settings({"service": {"base_url": url, "auth_url": url}, "client": {"id": "c"}})
        assert s.service.base_url == url.rstrip("/")
    with pytest.raises(ConfigError, match="loopback"):
        build_settings(
            {
                "service": {"base_url": "http://10.0.0.1", "auth_url": "https://a"},
                "client": {"id": "c"},
            }
        )


def test_invalid_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    """An unreadable config is a ConfigError that says what to do, not a traceback."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "[service\n"), env={})


def test_client_secret_is_read_from_its_file_and_masked(tmp_path: Path) -> None:
    """The client secret comes from client.secret_file and never shows in a repr."""
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-value\n")
    secret.chmod(0o600)
    s = load_settings(write(tmp_path, MINIMAL + f'secret_file = "{secret}"\n'), env={})
    value = read_client_secret(s)
    assert value.reveal() == "s3cr3t-value"
    assert "s3cr3t" not in repr(value) and "s3cr3t" not in f"{value}"


def test_missing_secret_file_names_the_key(tmp_path: Path) -> None:
    """A missing client secret file is a ConfigError naming client.secret_file."""
    s = load_settings(write(tmp_path, MINIMAL + 'secret_file = "/nonexistent/x"\n'), env={})
    with pytest.raises(ConfigError) as info:
        read_client_secret(s)
    assert info.value.key == "client.secret_file"
