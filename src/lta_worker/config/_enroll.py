"""The `[enroll]` settings that span sections, and the enrollment link key file.

When `enroll.listen` is set, `serve` hosts `/enroll/start` and the callback at the path of
`client.redirect_uri` on one listener: the browser must see both on one origin, because the
cookie set at the start has to come back with the callback. So `enroll.public_url` is then
required, and `client.redirect_uri` must have its scheme, host and port.

The link key file follows the rule of every secret file (`lta_worker.secret_file`) and holds
one key per line (at least 32 printable ASCII characters; `#` comments and blank lines
allowed), newest last: the last key signs new links, every key verifies, so a key is rotated
by appending a line and removing the old one once the links it signed have expired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from lta_worker.errors import ConfigError
from lta_worker.secret import Secret
from lta_worker.secret_file import read_secret_file

if TYPE_CHECKING:
    from lta_worker.config._settings import Settings

LINK_KEY_CREDENTIAL: Final = "enroll-link-key"
MIN_LINK_KEY: Final = 32
START_PATH: Final = "/enroll/start"
_KEY: Final = "enroll.link_key_file"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def start_path(settings: Settings) -> str:
    """The path of the start of the browser flow: `{public_url's path}/enroll/start`."""
    base = settings.enroll.public_url or ""
    return urlsplit(base).path.rstrip("/") + START_PATH


def start_url(settings: Settings) -> str:
    """The absolute URL of the start of the browser flow: `{enroll.public_url}/enroll/start`.

    Raises:
        ConfigError: `enroll.public_url` is not set.
    """
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
    """Read the enrollment link keys from `enroll.link_key_file`, oldest first.

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
