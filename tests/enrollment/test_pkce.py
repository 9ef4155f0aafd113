"""PKCE (RFC 7636) verifier, S256 challenge and state."""

from __future__ import annotations

import base64

import pytest

from lta_worker.enrollment import challenge_s256, new_state, new_verifier
from lta_worker.enrollment._enroll import UNRESERVED, is_valid_verifier
from lta_worker.secret import Secret

# RFC 7636, appendix B: the 32 random octets, the verifier they give, and its S256 challenge.
RFC_OCTETS = bytes(
    [116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186,
     22, 212, 37, 77, 105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121]
)  # fmt: skip
RFC_VERIFIER = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
RFC_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_rfc7636_appendix_b() -> None:
    """RFC 7636 appendix B: its octets give its verifier, and challenge_s256 its challenge."""
    assert base64.urlsafe_b64encode(RFC_OCTETS).rstrip(b"=").decode() == RFC_VERIFIER
    assert challenge_s256(Secret(RFC_VERIFIER)) == RFC_CHALLENGE


def test_new_verifiers_and_states_are_valid_fresh_and_secret() -> None:
    """New verifiers (in a Secret) and states are valid, URL-safe and fresh each time."""
    verifier = new_verifier()
    assert isinstance(verifier, Secret)
    raw = verifier.reveal()
    assert 43 <= len(raw) <= 128
    assert set(raw) <= UNRESERVED
    assert raw not in repr(verifier)
    assert raw not in f"{verifier}"
    state = new_state()
    assert len(state) >= 43
    assert set(state) <= UNRESERVED
    assert len({new_verifier().reveal() for _ in range(50)}) == 50
    assert len({new_state() for _ in range(50)}) == 50


@pytest.mark.parametrize(
    "raw",
    ["~" * 43, "~" * 128, "a" * 42, "a" * 129, "a" * 42 + "!", "a" * 42 + " ", "a" * 42 + "é"],
)
def test_verifiers_of_43_to_128_unreserved_characters_alone_are_valid(raw: str) -> None:
    """43 to 128 unreserved characters make a challenge; anything else is refused unshown."""
    if raw.startswith("~"):
        assert is_valid_verifier(Secret(raw))
        assert len(challenge_s256(Secret(raw))) == 43
        return
    assert not is_valid_verifier(Secret(raw))
    with pytest.raises(ValueError, match="43 to 128") as info:
        challenge_s256(Secret(raw))
    assert raw not in str(info.value)
