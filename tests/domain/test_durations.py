"""Durations as operators write them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.domain import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("30d", 30 * 86400),
        ("2w", 14 * 86400),
        ("250ms", 0.25),
        ("90", 90),
        (" 1H ", 3600),
        (45, 45),
        (1.5, 1.5),
        (timedelta(minutes=2), 120),
    ],
)
def test_accepted_forms(text: object, seconds: float) -> None:
    """Every documented form parses to the right number of seconds."""
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "abc", "1x", "h1", "-5s", "1h-", None, True, [], "nan"])
def test_rejected_forms_say_what_is_expected(bad: object) -> None:
    """A malformed duration raises ValueError with an example of the accepted form."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize(
    "huge",
    [10**400, 10**300, 1e308, float("inf"), "1" + "0" * 400, "1" + "0" * 400 + "s"],
    ids=["int-beyond-float", "int", "float", "inf", "digits-beyond-float", "seconds-beyond-float"],
)
def test_huge_durations_are_too_long(huge: object) -> None:
    """A number or string too big for a timedelta (or a float) raises ValueError: too long."""
    with pytest.raises(ValueError, match="too long to represent"):
        parse_duration(huge)


@given(st.integers(min_value=0, max_value=10**8))
def test_format_then_parse_round_trips(seconds: int) -> None:
    """format_duration's output parses back to the same whole number of seconds."""
    delta = timedelta(seconds=seconds)
    assert parse_duration(format_duration(delta)) == delta


@given(st.text(max_size=30))
def test_parser_raises_only_value_error(text: str) -> None:
    """Any string either parses to a non-negative duration or raises ValueError."""
    try:
        result = parse_duration(text)
    except ValueError:
        return
    assert result >= timedelta(0)
