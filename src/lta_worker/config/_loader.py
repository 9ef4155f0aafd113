"""Build `Settings` from defaults, a TOML file, `LTA_WORKER_<SECTION>_<KEY>` variables and
systemd's directories; read the secret files, which never come from the environment or an
argument (docs/config.md, "Credential files")."""

from __future__ import annotations

import base64
import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from lta_worker.config._fields import read_section
from lta_worker.config._settings import SECTIONS, Settings
from lta_worker.errors import ConfigError
from lta_worker.secret import Secret
from lta_worker.secret_file import BOM, read_secret_file

ENV_PREFIX = "LTA_WORKER_"
CONFIG_ENV = "LTA_WORKER_CONFIG"
SECRET_CREDENTIAL = "client-secret"  # noqa: S105 - a credential *name*
KEYS_CREDENTIAL = "token-keys"
WEBHOOK_CREDENTIAL = "webhook-secret"
LINK_KEY_CREDENTIAL: Final = "enroll-link-key"
MIN_LINK_KEY: Final = 32
START_PATH: Final = "/enroll/start"
_KEY: Final = "enroll.link_key_file"
# The usual proxy variables, first found wins. HTTP_PROXY is deliberately not among them:
# plain http goes only to loopback, and a proxy there would see the credential in clear.
HTTPS_PROXY_ENV = ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
NO_PROXY_ENV = ("no_proxy", "NO_PROXY")
MAX_CONFIG_BYTES = 1_048_576


def config_path(explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    """The config file to read: `--config`, else `$LTA_WORKER_CONFIG`, else none."""
    if explicit:
        return Path(explicit)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    source = f"config file {str(path)!r}"
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            # A directory or a FIFO: refused before opening, so reading never blocks.
            raise ConfigError(
                f"{source} is not a regular file",
                hint="pass --config PATH naming the TOML file itself",
            )
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(
            f"{source} does not exist",
            hint="pass --config PATH or set LTA_WORKER_CONFIG; see deploy/config.example.toml",
        ) from None
    except PermissionError:
        raise ConfigError(f"{source} is not readable by this user") from None
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read ({exc.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source} is larger than {MAX_CONFIG_BYTES} bytes: the wrong file?")
    if data.startswith(BOM):
        raise ConfigError(
            f"{source} starts with a UTF-8 byte order mark (BOM)",
            hint="save it as UTF-8 without a BOM",
        )
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(
            f"{source} is not UTF-8 text: is it the right file?",
            hint="pass --config PATH naming the TOML file",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from None
    except ValueError:  # int() refuses over 4300 decimal digits; tomllib lets that through
        raise ConfigError(f"{source} is not valid TOML: a number has too many digits") from None


def _env_overrides(env: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """`LTA_WORKER_<SECTION>_<KEY>` variables as sections, and the variable of each key."""
    out: dict[str, dict[str, str]] = {}
    origins: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        for section in SECTIONS:
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1 :]
                out.setdefault(section, {})[key] = value
                origins[f"{section}.{key}"] = name
                break
    return out, origins


def _merge(base: dict[str, Any], overrides: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in overrides.items():
        current = merged.get(section)
        merged[section] = {**(current if isinstance(current, dict) else {}), **values}
    return merged


def _systemd_defaults(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    creds, state = env.get("CREDENTIALS_DIRECTORY"), env.get("STATE_DIRECTORY")
    for section in ("client", "crypto", "database"):
        data.setdefault(section, {})
    for section, key, name in (
        ("client", "secret_file", SECRET_CREDENTIAL),
        ("crypto", "key_file", KEYS_CREDENTIAL),
        ("enroll", "link_key_file", LINK_KEY_CREDENTIAL),  # only where the section is used
        ("webhook", "secret_file", WEBHOOK_CREDENTIAL),
    ):
        values = data.get(section)
        if creds and isinstance(values, dict) and key not in values:
            values[key] = str(Path(creds) / name)
    database = data["database"]
    if state and isinstance(database, dict) and "url" not in database:
        database["url"] = f"sqlite:///{Path(state.split(':')[0]) / 'lta.db'}"
    return data


def _proxy_defaults(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Fill unset `service.https_proxy`/`no_proxy` from the usual variables; their origins."""
    origins = {}
    for key, names in (("https_proxy", HTTPS_PROXY_ENV), ("no_proxy", NO_PROXY_ENV)):
        name = next((n for n in names if env.get(n, "").strip()), None)
        service = data.get("service")
        if name and isinstance(service, dict) and key not in service:
            service[key] = env[name].strip()
            origins[f"service.{key}"] = name
    return origins


def build_settings(data: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> Settings:
    """Validate a plain mapping into `Settings`; ConfigError names the key of a problem, and
    the environment variable its value came from when `origins` (key -> variable) has it."""
    errors: list[tuple[str, str]] = []
    settings = read_section(Settings, data, "", errors)
    if settings is None:
        key, msg = errors[0]
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise _from_origin(ConfigError(msg + more, key=key), origins or {})
    try:
        check_enroll(settings)
    except ConfigError as exc:
        raise _from_origin(exc, origins or {}) from None
    return settings


def _from_origin(error: ConfigError, origins: Mapping[str, str]) -> ConfigError:
    """`error`, naming the environment variable its key's value came from, if one did."""
    key = error.key
    name = origins.get(key) if key else None
    if key is None or name is None:
        return error
    hint = (
        f"fix or unset {name} (LTA_WORKER_<SECTION>_<KEY>: see docs/config.md for the keys)"
        if name.startswith(ENV_PREFIX)
        else f'unset {name} for lta-worker, or set {key} ("" for none)'
    )
    message = error.message.removeprefix(f"{key}: ")
    named = ConfigError(f"{key} (from the environment variable {name}): {message}", hint=hint)
    named.key = key  # the plain key, as for any other setting
    return named


def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Read the TOML file (if any), apply environment overrides and validate."""
    env = os.environ if env is None else env
    file = config_path(path, env)
    data = _read_toml(file) if file else {}
    overrides, origins = _env_overrides(env)
    data = _merge(data, overrides)
    data = _systemd_defaults(data, env)
    return build_settings(data, {**origins, **_proxy_defaults(data, env)})


def read_client_secret(settings: Settings) -> Secret:
    """Read the client secret (printable ASCII, one line) from `client.secret_file`."""
    path = settings.client.secret_file
    if path is None:
        raise ConfigError(
            "no client secret file is configured",
            key="client.secret_file",
            hint="set client.secret_file, or run under systemd with LoadCredential=client-secret",
        )
    data = read_secret_file(path, key="client.secret_file")
    value = data.strip(b" \t\r\n")
    if not value or b"\n" in value:
        raise ConfigError(
            f"{str(path)!r} must hold the client secret on one line", key="client.secret_file"
        )
    bad = next((n for n, byte in enumerate(value, start=1) if not 0x21 <= byte <= 0x7E), None)
    if bad is not None:
        # The position only: the character itself is a piece of the secret.
        raise ConfigError(
            f"{str(path)!r} holds a space, control or non-ASCII character (character {bad}); "
            "a client secret is printable ASCII",
            key="client.secret_file",
            hint="write the secret exactly as the client's settings show it, on one line",
        )
    return Secret(value.decode("ascii"))


def key_file_path(settings: Settings) -> Path:
    """The configured key file, or ConfigError naming `crypto.key_file`."""
    if settings.crypto.key_file is None:
        raise ConfigError(
            "no token key file is configured",
            key="crypto.key_file",
            reason="key_file_unset",
        )
    return settings.crypto.key_file


WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 -- the format's prefix, not a secret


def read_webhook_secret(settings: Settings) -> Secret:
    """Read the webhook signing secret (`whsec_` + base64 of 24 to 64 bytes).

    Raises:
        ConfigError: naming `webhook.secret_file`, never quoting the content.
    """
    key = "webhook.secret_file"
    path = settings.webhook.secret_file
    if path is None:
        raise ConfigError(
            "webhook.url is set but no webhook secret file is configured",
            key=key,
            hint="write a whsec_... secret to a file (chmod 600) and set webhook.secret_file, "
            f"or run under systemd with LoadCredential={WEBHOOK_CREDENTIAL}",
        )
    value = read_secret_file(path, key=key).strip(b" \t\r\n")
    text = value.decode("ascii", errors="replace")
    body = text.removeprefix(WEBHOOK_SECRET_PREFIX)
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except ValueError:
        raw = b""
    if not text.startswith(WEBHOOK_SECRET_PREFIX) or not 24 <= len(raw) <= 64:
        raise ConfigError(
            f"{str(path)!r} must hold one Standard Webhooks secret: whsec_ then the base64 "
            "of 24 to 64 random bytes",
            key=key,
            hint="e.g. python3 -c \"import base64,os; print('whsec_' + "
            'base64.b64encode(os.urandom(32)).decode())"',
        )
    return Secret(text)


# -- [enroll]: one origin for the start and the callback, and the link keys -----------


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def start_path(settings: Settings) -> str:
    """The path of the start of the browser flow: `{public_url's path}/enroll/start`."""
    base = settings.enroll.public_url or ""
    return urlsplit(base).path.rstrip("/") + START_PATH


def start_url(settings: Settings) -> str:
    """The absolute URL of the start of the browser flow: `{enroll.public_url}/enroll/start`."""
    if settings.enroll.public_url is None:
        raise ConfigError(
            "is required for enrollment links (the address where users' browsers reach the "
            "enrollment listener of `serve`)",
            key="enroll.public_url",
        )
    return settings.enroll.public_url + START_PATH


def check_enroll(settings: Settings) -> None:
    """Refuse an `[enroll]` section whose parts do not fit together (exit 78, naming the key)."""
    enroll = settings.enroll
    if enroll.listen is None:
        return
    if enroll.public_url is None:
        raise ConfigError(
            "is required when enroll.listen is set (the address users' browsers reach)",
            key="enroll.public_url",
        )
    redirect = settings.client.redirect_uri
    if _origin(redirect) != _origin(enroll.public_url):
        raise ConfigError(
            f"must be on the origin of enroll.public_url ({enroll.public_url}): the callback "
            "is served by the same listener, and the browser's cookie must come back to it",
            key="client.redirect_uri",
        )
    if urlsplit(redirect).path in {start_path(settings), ""}:
        raise ConfigError(
            f"its path must differ from {start_path(settings)!r} and not be empty",
            key="client.redirect_uri",
        )


def read_link_keys(settings: Settings) -> tuple[Secret, ...]:
    """Read the enrollment link keys from `enroll.link_key_file`, oldest first (the last signs).

    Raises:
        ConfigError: naming `enroll.link_key_file`: unset, unsafe, unreadable, or holding a
            line that is not a key (by line number, never its content), or no key at all.
    """
    path = settings.enroll.link_key_file
    if path is None:
        raise ConfigError(
            "no enrollment link key file is configured",
            key=_KEY,
            hint=f"set {_KEY}, or run under systemd with LoadCredential={LINK_KEY_CREDENTIAL}",
        )
    data = read_secret_file(path, key=_KEY)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{str(path)!r} is not ASCII text", key=_KEY) from None
    keys: list[Secret] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < MIN_LINK_KEY or any(not 0x21 <= ord(c) <= 0x7E for c in line):
            raise ConfigError(
                f"{str(path)!r} line {number} is not a key: one key per line, at least "
                f"{MIN_LINK_KEY} printable characters without spaces",
                key=_KEY,
                hint="make one with `head -c 32 /dev/urandom | base64`",
            )
        keys.append(Secret(line))
    if not keys:
        raise ConfigError(f"{str(path)!r} holds no key", key=_KEY)
    return tuple(keys)
