"""The settings reader (`config._fields`) on any value an operator or the environment can give."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lta_worker.config import Settings, build_settings
from lta_worker.config._fields import field_types
from lta_worker.errors import ConfigError
from support.configs import with_setting

KEYS = sorted(
    (section, name)
    for section, model in field_types(Settings).items()
    for name in field_types(model)
)
# What TOML can hold, plus the strings environment overrides arrive as.
SCALARS = (
    st.text(max_size=20)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.sampled_from(["", "0", "-1", "1e309", "nan", "5m", "1h30m", "+7", "١٢", "https://x"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_is_taken_or_refused_naming_its_key(key: tuple[str, str], value: object) -> None:
    """Any value for any key is taken as the key's type or refused with exit 78 naming the key."""
    section, name = key
    refused: ConfigError | None = None
    try:
        built = build_settings(with_setting(f"{section}.{name}", value))
    except ConfigError as exc:
        refused = exc
    if refused is not None:
        assert refused.exit_code == 78
        # The key itself, or its section for a check across the section's fields ([enroll]).
        assert refused.key in (f"{section}.{name}", section), refused.key
        return
    got = getattr(getattr(built, section), name)
    kind = field_types(field_types(Settings)[section])[name]
    expected = get_origin(kind) or kind
    if expected is Literal:
        assert got in get_args(kind)
    elif got is not None:  # None only where the field is optional (its default)
        assert isinstance(got, expected), (key, value, got)


@pytest.mark.parametrize(("section", "name"), KEYS)
def test_a_table_where_a_value_belongs_is_refused(section: str, name: str) -> None:
    """A table given for a plain setting is refused naming the key, never taken as a value."""
    model = field_types(Settings)[section]
    if dataclasses.is_dataclass(field_types(model)[name]):
        pytest.skip("a nested section takes a table")
    with pytest.raises(ConfigError) as info:
        build_settings(with_setting(f"{section}.{name}", {"x": 1}))
    assert info.value.key == f"{section}.{name}"


@pytest.mark.parametrize(
    ("section", "name", "words"),
    [
        ("poll", "intervall", "spelling"),
        ("poll", "concurency", "did you mean poll.concurrency"),
        ("webhook", "secretfile", "did you mean webhook.secret_file"),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one(
    section: str, name: str, words: str
) -> None:
    """A misspelt key is refused by its dotted name, with a spelling hint or the key meant."""
    with pytest.raises(ConfigError, match=words) as info:
        build_settings(with_setting(f"{section}.{name}", 4))
    assert info.value.key == f"{section}.{name}"
