"""The token vault: AES-256-GCM round trip, binding to the row, tampering, nonces, no leaks."""

from __future__ import annotations

import dataclasses

import pytest

from lta_worker.domain import EncryptedToken
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


def test_round_trip(vault: Vault) -> None:
    """A token encrypted for a user decrypts back to the same Secret for that user."""
    sealed = vault.encrypt(TOKEN, user="alice")
    assert sealed.key_id == "k2"
    assert vault.decrypt(sealed, user="alice") == TOKEN


def test_unicode_round_trip(vault: Vault) -> None:
    """Any text survives encryption (verifiers are ASCII, but nothing assumes it)."""
    secret = Secret("ümlaut-токен-🔑")
    assert vault.decrypt(vault.encrypt(secret, user="u"), user="u") == secret


def test_ciphertext_holds_no_plaintext(vault: Vault) -> None:
    """The stored bytes contain neither the token nor its prefix."""
    sealed = vault.encrypt(TOKEN, user="alice")
    assert TOKEN.reveal().encode() not in sealed.ciphertext
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


def test_rows_swapped_are_rejected(vault: Vault) -> None:
    """Alice's ciphertext placed in Bob's row does not decrypt as Bob's token."""
    alice = vault.encrypt(TOKEN, user="alice")
    bob = vault.encrypt(Secret("dspa_bob"), user="bob")
    with pytest.raises(TokenDecryptError):
        vault.decrypt(alice, user="bob")
    with pytest.raises(TokenDecryptError):
        vault.decrypt(bob, user="alice")


def test_key_id_changed_is_rejected() -> None:
    """Relabelling a ciphertext with another key id (even one holding the same key) fails."""
    material = bytes(range(32))
    vault = Vault(Keyring({"k1": material, "k2": material}))
    sealed = vault.encrypt(TOKEN, user="alice")
    with pytest.raises(TokenDecryptError):
        vault.decrypt(dataclasses.replace(sealed, key_id="k1"), user="alice")


def test_purpose_is_bound(vault: Vault) -> None:
    """A PKCE verifier ciphertext is not accepted as a token and vice versa."""
    sealed = vault.encrypt(TOKEN, user="alice", purpose="verifier")
    with pytest.raises(TokenDecryptError):
        vault.decrypt(sealed, user="alice")
    assert vault.decrypt(sealed, user="alice", purpose="verifier") == TOKEN


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
    assert len(nonces) == 100_000


def test_same_token_twice_gives_different_ciphertexts(vault: Vault) -> None:
    """Encryption is randomized: equal tokens are not recognisable in the database."""
    assert vault.encrypt(TOKEN, user="a").ciphertext != vault.encrypt(TOKEN, user="a").ciphertext


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


def test_encrypted_token_is_plain_data() -> None:
    """EncryptedToken compares by value (the store hands them around)."""
    assert EncryptedToken(b"x", "k") == EncryptedToken(b"x", "k")
