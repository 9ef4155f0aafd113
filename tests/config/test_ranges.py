"""Every duration, size and count setting has a range, stated once in its field's metadata and
enforced at load (docs/config.md states it: tests/packaging/test_config_doc.py); the domain's, the
pass's and the pacer's config objects take every default from the settings' fields."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, fields
from datetime import timedelta

import pytest

from lta_worker.config import PollSettings, RateLimitSettings, Settings, build_settings
from lta_worker.config._fields import Bound, Rule, field_types, ranges, render
from lta_worker.domain import PolicyConfig
from lta_worker.domain._freshness import FreshnessConfig
from lta_worker.errors import ConfigError
from lta_worker.pacing import PacerCore
from lta_worker.pacing._window import DEFAULT_MAX_WAIT
from lta_worker.worker import PassOptions
from support.configs import BASE, with_setting

RANGES = ranges(Settings)


def test_every_duration_size_and_count_has_a_range() -> None:
    """No duration, size or count setting is left unbounded, and only they have a range."""
    keys = {
        f"{section}.{name}"
        for section, model in field_types(Settings).items()
        for name, kind in field_types(model).items()
        if kind in (timedelta, int, float)
    }
    assert keys, "no numeric settings found: the introspection is broken"
    assert sorted(keys - set(RANGES)) == []
    assert sorted(set(RANGES) - keys) == []


def test_defaults_are_within_their_ranges() -> None:
    """Every default value is inside its own range (a range never refuses the defaults)."""
    settings = build_settings(BASE)
    for key, (low, high) in RANGES.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(settings, section), name)
        assert low <= value <= high, (key, value)


def test_no_check_restates_a_range() -> None:
    """A ranged field has no check of its own beside the range: its bounds are in one place."""
    for section, model in field_types(Settings).items():
        for f in dataclasses.fields(model):
            checks = f.metadata.get("rule", Rule())
            if f"{section}.{f.name}" in RANGES:
                assert (checks.before, checks.check) == (None, None), f"{section}.{f.name}"


@pytest.mark.parametrize("key", sorted(RANGES))
def test_just_outside_the_range_is_refused_naming_the_key(key: str) -> None:
    """A value just outside a range is refused naming the key and bounds; the bounds are taken."""
    low, high = RANGES[key]
    for bound in (low, high):
        build_settings(with_setting(key, _as_setting(bound)))
    for outside in _outside(low, high):
        with pytest.raises(ConfigError) as info:
            build_settings(with_setting(key, _as_setting(outside)))
        assert info.value.key == key, (outside, info.value)
        between = f"must be between {render(low)} and {render(high)} (got {render(outside)})"
        assert str(info.value) == f"{key}: {between}"


def _as_setting(value: object) -> object:
    if isinstance(value, timedelta):
        return f"{value.total_seconds()}s"
    return value


def _outside(low: Bound, high: Bound) -> list[Bound]:
    if isinstance(low, timedelta) and isinstance(high, timedelta):
        below = [low - timedelta(milliseconds=1)] if low > timedelta(0) else []
        return [*below, high + timedelta(seconds=1)]
    if isinstance(low, int) and isinstance(high, int):
        return [low - 1, high + 1]
    return [float(low) - 0.01, float(high) * 1.01 + 0.01]


HUGE = 10**400  # a TOML integer no float holds
HUGER = 16**5000 - 1  # `0xfff...`: TOML hex has no digit limit, its decimal form has


@pytest.mark.parametrize("huge", [HUGE, -HUGE, HUGER], ids=["huge", "negative", "hex"])
@pytest.mark.parametrize("key", sorted(RANGES))
def test_a_huge_integer_is_refused_naming_the_key(key: str, huge: int) -> None:
    """An integer too big for a float, for any number or duration, is refused naming the key."""
    with pytest.raises(ConfigError) as info:
        build_settings(with_setting(key, huge))
    assert info.value.key == key
    assert "digits" not in str(info.value)  # not Python's own int-to-str limit message


def test_a_huge_integer_duration_is_too_long() -> None:
    """A huge integer duration gets the message of an over-long duration string (the parser on
    any text and on huge ones: tests/domain/test_durations.py)."""
    with pytest.raises(
        ConfigError, match=r"^poll\.interval: invalid duration.*: too long to represent$"
    ):
        build_settings(with_setting("poll.interval", HUGE))


M, H = timedelta(minutes=1), timedelta(hours=1)


def test_config_objects_state_no_default_of_their_own() -> None:
    """PolicyConfig, FreshnessConfig and PassOptions restate no setting's default."""
    for cls, own in ((PolicyConfig, {"plan"}), (FreshnessConfig, set()), (PassOptions, set())):
        defaulted = {
            f.name
            for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING
        }
        assert defaulted == own, cls


def test_the_policy_is_built_from_poll() -> None:
    """`PollSettings.policy()` carries every `[poll]` key the policy and freshness schedule use."""
    poll = PollSettings(
        interval=30 * M,
        parked_interval=12 * H,
        backoff_base=timedelta(seconds=10),
        schedule="adaptive",
        max_interval=10 * M,
        stats="on_change",
        stats_max_age=2 * H,
        rate_half_life=24 * H,
    )
    policy = poll.policy()
    assert policy == PolicyConfig(
        30 * M, 12 * H, timedelta(seconds=10), "adaptive", 10 * M, "on_change", 2 * H, 24 * H
    )
    assert policy.freshness == FreshnessConfig(
        "adaptive", 30 * M, 30 * M, "on_change", 2 * H, 24 * H
    )


def test_the_pacers_defaults_are_the_settings() -> None:
    """The pacer's defaults (reserve, fallback rate, max_wait) are `[ratelimit]`'s."""
    core, ratelimit = PacerCore(), RateLimitSettings()
    assert (core.reserve_fraction, core.fallback_per_hour, core.max_wait) == (
        ratelimit.reserve,
        ratelimit.fallback_per_hour,
        ratelimit.max_wait.total_seconds(),
    )
    assert ratelimit.max_wait.total_seconds() == DEFAULT_MAX_WAIT
