"""The token vault (AES-256-GCM round trip, binding to the row, tampering, nonces, no leaks) and
its key file (parsing, permissions, missing files, generated lines)."""

from __future__ import annotations

import base64
import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.errors import KeyFileError, UnknownKeyError
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, TokenDecryptError, Vault, generate_key_line, load_key_file
from lta_worker.storage._vault import (
    KEY_ID_PATTERN,
    NONCE_BYTES,
    format_key_line,
    new_key_id,
    parse_key_file,
)
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
def test_a_flipped_byte_or_a_cut_is_rejected(vault: Vault, position: int) -> None:
    """Flipping any byte (version, nonce, body or tag), or cutting the ciphertext there, fails."""
    sealed = vault.encrypt(TOKEN, user="alice")
    flipped = bytearray(sealed.ciphertext)
    flipped[position] ^= 0x01
    for data in (bytes(flipped), sealed.ciphertext[:position]):
        with pytest.raises(TokenDecryptError):
            vault.decrypt(dataclasses.replace(sealed, ciphertext=data), user="alice")


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


def test_unknown_key_id_names_the_key(vault: Vault) -> None:
    """A token under a key id missing from the key file raises UnknownKeyError naming it;
    require_keys passes for listed ids and names the first missing one."""
    sealed = Vault(keyring("gone")).encrypt(TOKEN, user="alice")
    with pytest.raises(UnknownKeyError) as info:
        vault.decrypt(sealed, user="alice")
    assert info.value.key_id == "gone"
    assert "'gone'" in str(info.value)
    assert info.value.exit_code == 78
    vault.require_keys(["k1", "k2"])
    with pytest.raises(UnknownKeyError, match="'k0'"):
        vault.require_keys(["k2", "k0", "k9"])


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


key_ids = st.from_regex(KEY_ID_PATTERN, fullmatch=True)
materials = st.binary(min_size=32, max_size=32)
comments = st.text(st.characters(exclude_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))
fillers = st.lists(st.one_of(st.just(""), st.just("   "), comments.map(lambda c: "#" + c)))


ZEROS = base64.b64encode(bytes(32)).decode()


def write_key_file(path: Path, text: str, mode: int = 0o600) -> Path:
    """Write a key file with `mode`."""
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


@given(
    keys=st.dictionaries(key_ids, materials, min_size=1, max_size=6),
    before=st.lists(fillers, min_size=7, max_size=7),
)
def test_formatted_keyring_parses_back(keys: dict[str, bytes], before: list[list[str]]) -> None:
    """Any keyring written as lines, with comments and blank lines around, parses back."""
    lines: list[str] = []
    for index, (key_id, material) in enumerate(keys.items()):
        lines += before[index]
        lines.append(format_key_line(key_id, material))
    lines += before[-1]
    ring = parse_key_file("\n".join(lines))
    assert dict(ring.keys) == keys
    assert ring.current_id == list(keys)[-1]


@given(st.text(max_size=300))
def test_arbitrary_text_parses_or_raises_key_file_error(text: str) -> None:
    """Any text either parses or raises KeyFileError naming crypto.key_file, nothing else."""
    error: KeyFileError | None = None
    try:
        ring = parse_key_file(text)
    except KeyFileError as exc:
        error = exc
    if error is not None:
        assert error.key == "crypto.key_file"
    else:
        assert all(len(m) == 32 for m in ring.keys.values())


@given(keys=st.dictionaries(key_ids, materials, min_size=1, max_size=3))
def test_error_messages_never_show_key_material(keys: dict[str, bytes]) -> None:
    """A duplicate id or a short key names line and id, never any key material."""
    lines = [format_key_line(k, m) for k, m in keys.items()]
    first = lines[0]
    short_id = "short"
    short = f"{short_id}:{base64.b64encode(next(iter(keys.values()))[:31]).decode()}"
    for text in ("\n".join([*lines, first]), "\n".join([*lines, short])):
        with pytest.raises(KeyFileError) as info:
            parse_key_file(text)
        message = str(info.value)
        for material in keys.values():
            assert base64.b64encode(material).decode() not in message
            assert base64.b64encode(material[:31]).decode() not in message
        assert "line" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "lists no key"),
        ("# only a comment\n\n", "lists no key"),
        ("k1", "not `ID:BASE64`"),
        (":" + ZEROS, "not `ID:BASE64`"),
        ("bad id:" + ZEROS, "not `ID:BASE64`"),
        ("k1:not base64!", "32 bytes"),
        ("k1:" + base64.b64encode(bytes(16)).decode(), "32 bytes"),
        ("k1:" + base64.b64encode(bytes(33)).decode(), "32 bytes"),
        (f"k1:{ZEROS}\nk1:{ZEROS}", "listed twice"),
    ],
)
def test_malformed_files_are_refused(text: str, fragment: str) -> None:
    """Each kind of malformed key file gets a KeyFileError that says what is wrong."""
    with pytest.raises(KeyFileError, match=r"crypto\.key_file") as info:
        parse_key_file(text)
    assert fragment in str(info.value)


def test_whitespace_around_fields_is_tolerated() -> None:
    """Indentation, spaces around ':' and CRLF line ends are accepted."""
    encoded = base64.b64encode(bytes(range(32))).decode()
    ring = parse_key_file(f"  # keys\r\n  k1 : {encoded}  \r\n")
    assert ring.keys == {"k1": bytes(range(32))}


def test_keyring_needs_a_key() -> None:
    """An empty Keyring cannot be built."""
    with pytest.raises(KeyFileError):
        Keyring({})


@pytest.mark.parametrize(
    ("mode", "words"),
    [(0o640, "chmod 600"), (0o604, "chmod 600"), (0o660, "chmod 600"), (0o644, "chmod 600"),
     (None, "does not exist"), ("dir", "crypto.key_file")],
)  # fmt: skip
def test_load_refuses_what_is_not_a_private_key_file(
    tmp_path: Path, mode: int | str | None, words: str
) -> None:
    """A key file others may read, a missing one or a directory: KeyFileError (78) saying so."""
    path = tmp_path / "keys"
    if isinstance(mode, int):
        write_key_file(path, generate_key_line(datetime.now(UTC)), mode)
    elif mode == "dir":
        path.mkdir(mode=0o700)
    with pytest.raises(KeyFileError) as info:
        load_key_file(path)
    assert words in str(info.value) and "crypto.key_file" in str(info.value)
    assert info.value.exit_code == 78
    if mode is None:  # the CLI turns `missing` into how to make one: tests/cli/test_hints.py
        assert info.value.reason == "missing"


def test_load_reads_a_private_file(tmp_path: Path) -> None:
    """A 0600 (or 0400) key file loads; the last line is current."""
    lines = "\n".join(generate_key_line(datetime(2025, 1, d, tzinfo=UTC)) for d in (1, 2))
    for mode in (0o600, 0o400):
        ring = load_key_file(write_key_file(tmp_path / f"keys{mode}", lines + "\n", mode))
        assert ring.current_id.startswith("k20250102")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_load_unreadable_file(tmp_path: Path) -> None:
    """A key file this user cannot read raises KeyFileError."""
    path = write_key_file(tmp_path / "keys", generate_key_line(datetime.now(UTC)), 0o000)
    with pytest.raises(KeyFileError, match="cannot be read"):
        load_key_file(path)


def test_generated_lines_parse_with_unique_ids_and_fresh_keys() -> None:
    """Generated lines parse as `k<UTC timestamp>:BASE64`, ids unique, key material fresh."""
    now = datetime(2025, 6, 1, 12, 30, 15, 123456, tzinfo=UTC)
    ring = parse_key_file(generate_key_line(now))
    assert ring.current_id == "k20250601T123015123456Z"
    assert len(ring.keys[ring.current_id]) == 32
    taken: set[str] = set()
    for _ in range(5):
        taken.add(new_key_id(now, frozenset(taken)))
    assert len(taken) == 5
    assert all(KEY_ID_PATTERN.fullmatch(k) for k in taken)
    first, second = (generate_key_line(now).split(":")[1] for _ in range(2))
    assert first != second
