"""The token vault: AES-256-GCM encryption of tokens and PKCE verifiers at rest.

Stored form (`EncryptedToken.ciphertext`): one format-version byte, a fresh random 96-bit
nonce, then AES-GCM's ciphertext and tag. The associated data binds a ciphertext to its row:
the format version, what it is (`token` or `verifier`), the client's user id and the key id.
A ciphertext copied into another user's row, relabelled with another key id, or altered by
one bit fails authentication instead of decrypting.

Plaintext goes in and comes out only as `Secret`; no repr or error message holds it.
"""

from __future__ import annotations

import hmac
import os
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Literal

from lta_worker.domain import EncryptedToken
from lta_worker.errors import ConfigError, UnknownKeyError
from lta_worker.secret import Secret
from lta_worker.storage._keyfile import Keyring, load_key_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from lta_worker.config import Settings

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
        """The AES-GCM cipher of `key_id` (UnknownKeyError when the key file lacks it)."""
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
        """Decrypt the stored secret of `user`'s row.

        Raises:
            UnknownKeyError: the key id is not in the key file (exit 78; nothing is changed).
            TokenDecryptError: the ciphertext does not authenticate for this row and key.
        """
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
