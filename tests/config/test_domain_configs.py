"""The domain's, the pass's and the pacer's config objects take every default from the
settings' fields (the one home of each), through one typed builder."""

from __future__ import annotations

from dataclasses import MISSING, fields
from datetime import timedelta

from lta_worker.config import PollSettings, RateLimitSettings
from lta_worker.domain import PolicyConfig
from lta_worker.domain._freshness import FreshnessConfig
from lta_worker.pacing import PacerCore
from lta_worker.pacing._window import DEFAULT_MAX_WAIT
from lta_worker.worker import PassOptions

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
