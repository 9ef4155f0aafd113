"""The token vault: AES-256-GCM at rest for tokens and PKCE verifiers, and its key file.

Stored: a version byte, a 96-bit nonce, ciphertext and tag; the associated data (version,
purpose, user id, key id) makes a ciphertext moved, relabelled or altered fail to decrypt.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from lta_worker.domain import EncryptedToken
from lta_worker.errors import ConfigError, KeyFileError, UnknownKeyError
from lta_worker.secret import Secret
from lta_worker.secret_file import read_secret_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from lta_worker.config import Settings

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
    """Parse key file text (`ID:BASE64(32 bytes)` lines) into a Keyring; else KeyFileError."""
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
    """Read and parse the key file at `path` under the secret file rule; else KeyFileError."""
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


FORMAT_VERSION: Final = 1
NONCE_BYTES: Final = 12
_HEADER: Final = 1 + NONCE_BYTES
_DOMAIN: Final = b"lta-worker/vault"

Purpose = Literal["token", "verifier"]


class TokenDecryptError(ConfigError):
    """A stored secret does not authenticate under the key its row names."""

    def __init__(self, *, user: str, key_id: str, purpose: Purpose) -> None:
        super().__init__(
            f"the stored {purpose} of user {user!r} under key id {key_id!r} does not decrypt: "
            f"the key line {key_id!r} was changed or the row was altered",
            key="crypto.key_file",
            hint="restore the original key line; nothing was modified or deleted",
        )
        self.user = user
        self.key_id = key_id


def associated_data(*, version: int, purpose: Purpose, user: str, key_id: str) -> bytes:
    """The AES-GCM associated data binding a ciphertext to its row (length-prefixed fields)."""
    parts = [_DOMAIN, bytes([version]), purpose.encode(), user.encode(), key_id.encode()]
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


class Vault:
    """Encrypts under the key file's newest key; decrypts under any key it lists
    (`cryptography` is imported at a key's first use: `status` never needs it)."""

    __slots__ = ("_aead", "_keyring")

    def __init__(self, keyring: Keyring) -> None:
        self._keyring = keyring
        self._aead: dict[str, AESGCM] = {}

    def _cipher(self, key_id: str) -> AESGCM:
        aead = self._aead.get(key_id)
        if aead is None:
            material = self._keyring.keys.get(key_id)
            if material is None:
                raise UnknownKeyError(key_id)
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            aead = self._aead[key_id] = AESGCM(material)
        return aead

    @classmethod
    def from_settings(cls, settings: Settings) -> Vault:
        """Load the key file named by `crypto.key_file` (KeyFileError, exit 78, when unusable)."""
        from lta_worker.config import key_file_path

        return cls(load_key_file(key_file_path(settings)))

    @property
    def current_key_id(self) -> str:
        """The id of the key new ciphertexts are made with."""
        return self._keyring.current_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id this vault can decrypt with, in key file order."""
        return self._keyring.ids

    def __repr__(self) -> str:
        return f"Vault(key_ids={self.key_ids!r}, current={self.current_key_id!r})"

    def require_keys(self, key_ids: Iterable[str]) -> None:
        """Raise UnknownKeyError for the first key id (in sorted order) that is not listed."""
        missing = sorted(set(key_ids) - set(self._keyring.keys))
        if missing:
            raise UnknownKeyError(missing[0])

    def keys_missing_from(self, other: Vault) -> list[str]:
        """The key ids (sorted) whose key `other` lacks or holds another key under: what it
        could not decrypt that this vault can (compared in constant time, never shown)."""
        theirs = other._keyring.keys
        return sorted(
            key_id
            for key_id, material in self._keyring.keys.items()
            if not hmac.compare_digest(material, theirs.get(key_id, b""))
        )

    def encrypt(self, secret: Secret, *, user: str, purpose: Purpose = "token") -> EncryptedToken:
        """Encrypt `secret` for the row of `user` under the newest key, with a fresh nonce."""
        key_id = self.current_key_id
        nonce = os.urandom(NONCE_BYTES)
        aad = associated_data(version=FORMAT_VERSION, purpose=purpose, user=user, key_id=key_id)
        sealed = self._cipher(key_id).encrypt(nonce, secret.reveal().encode("utf-8"), aad)
        return EncryptedToken(ciphertext=bytes([FORMAT_VERSION]) + nonce + sealed, key_id=key_id)

    def decrypt(self, token: EncryptedToken, *, user: str, purpose: Purpose = "token") -> Secret:
        """Decrypt the stored secret of `user`'s row (UnknownKeyError, TokenDecryptError)."""
        aead = self._cipher(token.key_id)
        data = token.ciphertext
        if len(data) <= _HEADER or data[0] != FORMAT_VERSION:
            raise TokenDecryptError(user=user, key_id=token.key_id, purpose=purpose)
        aad = associated_data(version=data[0], purpose=purpose, user=user, key_id=token.key_id)
        from cryptography.exceptions import InvalidTag

        try:
            plain = aead.decrypt(data[1:_HEADER], data[_HEADER:], aad)
            return Secret(plain.decode("utf-8"))
        except (InvalidTag, UnicodeDecodeError):
            raise TokenDecryptError(user=user, key_id=token.key_id, purpose=purpose) from None

    def reencrypt(
        self, token: EncryptedToken, *, user: str, purpose: Purpose = "token"
    ) -> EncryptedToken:
        """Decrypt `token` and encrypt it again under the newest key (for rotation)."""
        return self.encrypt(
            self.decrypt(token, user=user, purpose=purpose), user=user, purpose=purpose
        )
