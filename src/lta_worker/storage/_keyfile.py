"""The token key file: lines `ID:BASE64(32 bytes)`, newest last.

    # comments and blank lines are allowed
    k20250101T000000000000Z:3q2+7w...=      <- still decrypts older tokens
    k20250601T120000000000Z:Zm9vYmFy...=    <- the last key line encrypts

Every listed key decrypts; the last one encrypts. The file follows the rule of every secret
file (`lta_worker.secret_file`): regular, closed to group and others, no BOM. Error
messages name the file, the line number and the key id, never key material.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from lta_worker.errors import KeyFileError
from lta_worker.secret_file import read_secret_file

KEY_BYTES: Final = 32
KEY_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SETTING: Final = "crypto.key_file"


@dataclass(frozen=True, slots=True)
class Keyring:
    """Keys by id, in file order; the last one is current (encrypts)."""

    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyFileError("lists no key", key=_SETTING, reason="no_key")

    @property
    def current_id(self) -> str:
        """The id of the key that encrypts: the last key line."""
        return next(reversed(list(self.keys)))

    @property
    def ids(self) -> tuple[str, ...]:
        """Every key id, in file order."""
        return tuple(self.keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self.keys

    def __repr__(self) -> str:
        return f"Keyring(ids={self.ids!r}, current={self.current_id!r})"


def parse_key_file(text: str, *, source: str = "key file") -> Keyring:
    """Parse key file text into a Keyring.

    Raises:
        KeyFileError: naming `crypto.key_file` and the line, for a malformed line, a key that is
            not base64 of exactly 32 bytes, a duplicate id, or a file with no key.
    """
    keys: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key_id, sep, encoded = line.partition(":")
        key_id, encoded = key_id.strip(), encoded.strip()
        where = f"{source} line {number}"
        if not sep or not KEY_ID_PATTERN.fullmatch(key_id):
            raise KeyFileError(
                f"{where} is not `ID:BASE64` (ID: letters, digits, '_', '.', '-'; at most 64)",
                key=_SETTING,
                reason="malformed",
            )
        try:
            material = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            material = b""
        if len(material) != KEY_BYTES:
            raise KeyFileError(
                f"{where}: key {key_id!r} is not the base64 form of {KEY_BYTES} bytes",
                key=_SETTING,
                reason="malformed",
            )
        if key_id in keys:
            raise KeyFileError(f"{where}: key id {key_id!r} is listed twice", key=_SETTING)
        keys[key_id] = material
    if not keys:
        raise KeyFileError(f"{source} lists no key", key=_SETTING, reason="no_key")
    return Keyring(keys)


def load_key_file(path: Path) -> Keyring:
    """Read and parse the key file at `path` under the secret file rule (`secret_file`).

    Raises:
        KeyFileError: naming `crypto.key_file` when the file is unusable or malformed.
    """
    source = f"key file {str(path)!r}"
    data = read_secret_file(path, key=_SETTING, error=KeyFileError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{source} is not UTF-8 text", key=_SETTING) from None
    return parse_key_file(text, source=source)


def new_key_id(now: datetime, taken: frozenset[str] = frozenset()) -> str:
    """A key id from the UTC time, `k20250601T120000123456Z`, unique among `taken`."""
    stamp = now.astimezone(UTC)
    key_id = "k" + stamp.strftime("%Y%m%dT%H%M%S%fZ")
    suffix = 1
    candidate = key_id
    while candidate in taken:
        suffix += 1
        candidate = f"{key_id}-{suffix}"
    return candidate


def format_key_line(key_id: str, material: bytes) -> str:
    """The key file line for a key (the caller decides where it goes; never log it)."""
    if not KEY_ID_PATTERN.fullmatch(key_id) or len(material) != KEY_BYTES:
        raise ValueError("a key line needs a valid id and exactly 32 bytes")
    return f"{key_id}:{base64.b64encode(material).decode('ascii')}"


def generate_key_line(now: datetime, taken: frozenset[str] = frozenset()) -> str:
    """A new random key line `ID:BASE64(32 bytes)` for the key file."""
    return format_key_line(new_key_id(now, taken), os.urandom(KEY_BYTES))
