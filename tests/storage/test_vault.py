"""The token vault: AES-256-GCM round trip, binding to the row, tampering, nonces, no leaks."""

from __future__ import annotations

import dataclasses

import pytest

from lta_worker.errors import UnknownKeyError
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, TokenDecryptError, Vault
from lta_worker.storage._vault import NONCE_BYTES
from support.storage import keyring

TOKEN = Secret("dspa_0123456789abcdefghijklmnopqrstuvwxyz")


@pytest.fixture
def vault() -> Vault:
    """A vault with two keys, k2 current."""
    return Vault(keyring("k1", "k2"))


@pytest.mark.parametrize("token", [TOKEN, Secret("ümlaut-токен-🔑")], ids=["ascii", "unicode"])
def test_round_trip_holds_no_plaintext(vault: Vault, token: Secret) -> None:
    """A token sealed for a user under the current key decrypts back; the bytes hide it."""
    sealed = vault.encrypt(token, user="alice")
    assert sealed.key_id == "k2"
    assert vault.decrypt(sealed, user="alice") == token
    assert token.reveal().encode() not in sealed.ciphertext
    assert b"dspa_" not in sealed.ciphertext


@pytest.mark.parametrize("position", [0, 1, 5, 13, 20, -1, -16])
def test_flipped_byte_is_rejected(vault: Vault, position: int) -> None:
    """Flipping any byte (version, nonce, body or tag) makes decryption fail."""
    sealed = vault.encrypt(TOKEN, user="alice")
    data = bytearray(sealed.ciphertext)
    data[position] ^= 0x01
    with pytest.raises(TokenDecryptError):
        vault.decrypt(dataclasses.replace(sealed, ciphertext=bytes(data)), user="alice")


def test_truncated_ciphertext_is_rejected(vault: Vault) -> None:
    """A ciphertext cut short does not decrypt."""
    sealed = vault.encrypt(TOKEN, user="alice")
    for size in (0, 1, 13, len(sealed.ciphertext) - 1):
        with pytest.raises(TokenDecryptError):
            vault.decrypt(
                dataclasses.replace(sealed, ciphertext=sealed.ciphertext[:size]), user="a"
            )


def test_ciphertext_is_bound_to_user_purpose_and_key_id() -> None:
    """Another user's row, the other purpose, or another key id (same material) fails."""
    material = bytes(range(32))
    vault = Vault(Keyring({"k1": material, "k2": material}))
    sealed = vault.encrypt(TOKEN, user="alice")
    verifier = vault.encrypt(TOKEN, user="alice", purpose="verifier")
    for wrong, user in ((sealed, "bob"), (verifier, "alice"),
                        (dataclasses.replace(sealed, key_id="k1"), "alice")):  # fmt: skip
        with pytest.raises(TokenDecryptError):
            vault.decrypt(wrong, user=user)
    with pytest.raises(TokenDecryptError):
        vault.decrypt(sealed, user="alice", purpose="verifier")
    assert vault.decrypt(verifier, user="alice", purpose="verifier") == TOKEN


def test_unknown_key_id_names_the_key() -> None:
    """A token under a key id missing from the key file raises UnknownKeyError naming it."""
    old = Vault(keyring("gone"))
    sealed = old.encrypt(TOKEN, user="alice")
    with pytest.raises(UnknownKeyError) as info:
        Vault(keyring("k1")).decrypt(sealed, user="alice")
    assert info.value.key_id == "gone"
    assert "'gone'" in str(info.value)
    assert info.value.exit_code == 78


def test_wrong_material_under_same_id_is_rejected() -> None:
    """A key line replaced by other bytes under the same id fails with a clear error."""
    sealed = Vault(keyring("k1")).encrypt(TOKEN, user="alice")
    with pytest.raises(TokenDecryptError) as info:
        Vault(keyring("k1")).decrypt(sealed, user="alice")
    assert "'k1'" in str(info.value)
    assert info.value.exit_code == 78


def test_every_listed_key_decrypts_the_last_encrypts() -> None:
    """A token sealed under an older key still decrypts; new ones use the last key."""
    ring = keyring("old", "new")
    older = Vault(Keyring({"old": ring.keys["old"]})).encrypt(TOKEN, user="u")
    vault = Vault(ring)
    assert vault.decrypt(older, user="u") == TOKEN
    assert vault.encrypt(TOKEN, user="u").key_id == "new"


def test_no_repeated_nonce_in_100000_encryptions(vault: Vault) -> None:
    """100,000 encryptions of the same token under one key never reuse a nonce."""
    nonces = {
        vault.encrypt(TOKEN, user="alice").ciphertext[1 : 1 + NONCE_BYTES] for _ in range(100_000)
    }
    assert len(nonces) == 100_000  # so equal tokens never look alike in the database


def test_reprs_and_errors_hold_no_secret(vault: Vault) -> None:
    """Neither the vault, the keyring, a sealed token nor an error shows key or token bytes."""
    sealed = vault.encrypt(TOKEN, user="alice")
    shown = repr(vault) + repr(sealed) + repr(keyring("k1"))
    assert "dspa_" not in shown
    assert sealed.ciphertext.hex() not in shown
    with pytest.raises(TokenDecryptError) as info:
        vault.decrypt(sealed, user="bob")
    assert TOKEN.reveal() not in str(info.value)
    assert repr(vault.decrypt(sealed, user="alice")) == "Secret('**********')"


def test_require_keys_names_the_first_missing(vault: Vault) -> None:
    """require_keys passes for listed ids and names a missing one."""
    vault.require_keys(["k1", "k2"])
    with pytest.raises(UnknownKeyError, match="'k0'"):
        vault.require_keys(["k2", "k0", "k9"])
