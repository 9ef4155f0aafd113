"""Build `Settings` from a TOML file, the environment and systemd's directories.

Precedence, lowest first: built-in defaults, the TOML file, `LTA_WORKER_<SECTION>_<KEY>`
environment variables. Secrets never come from the environment or an argument: the client
secret and the token keys are read from files (`client.secret_file`, `crypto.key_file`, or
`$CREDENTIALS_DIRECTORY/client-secret` and `$CREDENTIALS_DIRECTORY/token-keys`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lta_worker.config.settings import SECTIONS, Settings
from lta_worker.errors import ConfigError
from lta_worker.secret import Secret

ENV_PREFIX = "LTA_WORKER_"
CONFIG_ENV = "LTA_WORKER_CONFIG"
SECRET_CREDENTIAL = "client-secret"  # noqa: S105 - a credential *name*
KEYS_CREDENTIAL = "token-keys"


def config_path(explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    """The config file to read: `--config`, else `$LTA_WORKER_CONFIG`, else none."""
    if explicit:
        return Path(explicit)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} does not exist",
            hint="pass --config PATH or set LTA_WORKER_CONFIG; see deploy/config.example.toml",
        ) from None
    except PermissionError:
        raise ConfigError(f"config file {str(path)!r} is not readable by this user") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        for section in SECTIONS:
            if rest.startswith(section + "_"):
                out.setdefault(section, {})[rest[len(section) + 1 :]] = value
                break
    return out


def _merge(base: dict[str, Any], overrides: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in overrides.items():
        current = merged.get(section)
        merged[section] = {**(current if isinstance(current, dict) else {}), **values}
    return merged


def _systemd_defaults(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    creds = env.get("CREDENTIALS_DIRECTORY")
    state = env.get("STATE_DIRECTORY")
    client = data.setdefault("client", {})
    crypto = data.setdefault("crypto", {})
    database = data.setdefault("database", {})
    if creds and isinstance(client, dict) and "secret_file" not in client:
        client["secret_file"] = str(Path(creds) / SECRET_CREDENTIAL)
    if creds and isinstance(crypto, dict) and "key_file" not in crypto:
        crypto["key_file"] = str(Path(creds) / KEYS_CREDENTIAL)
    if state and isinstance(database, dict) and "url" not in database:
        first = state.split(":")[0]
        database["url"] = f"sqlite:///{Path(first) / 'lta.db'}"
    return data


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    loc = ".".join(str(p) for p in error.get("loc", ()))
    kind = error.get("type", "")
    if kind == "missing":
        return loc, "is required"
    if kind == "extra_forbidden":
        return loc, "is not a known setting (check the spelling against the config reference)"
    msg = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
    return loc, msg


def build_settings(data: Mapping[str, Any]) -> Settings:
    """Validate a plain mapping into `Settings`; a problem raises ConfigError naming the key."""
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        key, msg = _describe(errors[0])
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ConfigError(msg + more, key=key) from None


def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Read the TOML file (if any), apply environment overrides and validate."""
    env = os.environ if env is None else env
    file = config_path(path, env)
    data = _read_toml(file) if file else {}
    data = _merge(data, _env_overrides(env))
    data = _systemd_defaults(data, env)
    return build_settings(data)


def read_client_secret(settings: Settings) -> Secret:
    """Read the client secret from `client.secret_file`; never from the environment."""
    path = settings.client.secret_file
    if path is None:
        raise ConfigError(
            "no client secret file is configured",
            key="client.secret_file",
            hint="set client.secret_file, or run under systemd with LoadCredential=client-secret",
        )
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(f"{str(path)!r} does not exist", key="client.secret_file") from None
    except OSError as exc:
        raise ConfigError(
            f"{str(path)!r} cannot be read ({exc.strerror})", key="client.secret_file"
        ) from None
    if not value or any(c.isspace() for c in value):
        raise ConfigError(
            f"{str(path)!r} must hold the client secret on one line", key="client.secret_file"
        )
    return Secret(value)


def key_file_path(settings: Settings) -> Path:
    """The configured key file, or ConfigError naming `crypto.key_file`."""
    if settings.crypto.key_file is None:
        raise ConfigError(
            "no token key file is configured",
            key="crypto.key_file",
            hint="`lta-worker keys generate > FILE` (mode 0600), then set crypto.key_file",
        )
    return settings.crypto.key_file
