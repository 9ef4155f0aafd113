"""The RateLimit parser: every header format, malformed input, and round trips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.pacing import RateLimitInfo
from lta_worker.pacing._ratelimit import MAX_CLOCK_SKEW, _http_date, parse_answer, parse_ratelimit

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
EPOCH = int(NOW.timestamp())


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"RateLimit": '"default";r=50;t=30', "RateLimit-Policy": '"default";q=100;w=3600'},
            RateLimitInfo(100, 50, 30.0, 3600.0, None, "draft-08"),
            id="draft-08",
        ),
        pytest.param(
            {"RateLimit": "default;r=50;t=30", "RateLimit-Policy": "default;q=100;w=60"},
            RateLimitInfo(100, 50, 30.0, 60.0, None, "draft-08"),
            id="draft-08-token-names",
        ),
        pytest.param(
            {
                "RateLimit": '"hour";r=50;t=1800, "day";r=7;t=40000',
                "RateLimit-Policy": '"day";q=1000;w=86400, "hour";q=100;w=3600',
            },
            RateLimitInfo(1000, 7, 40000.0, 86400.0, None, "draft-08"),
            id="draft-08-most-restrictive-by-name",
        ),
        pytest.param(
            {"RateLimit": '"p";r=5;t=10'},
            RateLimitInfo(None, 5, 10.0, None, None, "draft-08"),
            id="draft-08-without-policy",
        ),
        pytest.param(
            {"ratelimit": "limit=100, remaining=50, reset=30"},
            RateLimitInfo(100, 50, 30.0, None, None, "draft-07"),
            id="draft-07-dictionary",
        ),
        pytest.param(
            {"RateLimit": "limit=100, remaining=0, reset=5", "RateLimit-Policy": "100;w=60"},
            RateLimitInfo(100, 0, 5.0, 60.0, None, "draft-07"),
            id="draft-07-with-policy",
        ),
        pytest.param(
            {"RateLimit-Limit": "100", "RateLimit-Remaining": "7", "RateLimit-Reset": "20"},
            RateLimitInfo(100, 7, 20.0, None, None, "triple"),
            id="triple",
        ),
        pytest.param(
            {
                "RateLimit-Limit": "100, 100;w=3600, 1000;w=86400",
                "RateLimit-Remaining": "7",
                "RateLimit-Reset": "20",
            },
            RateLimitInfo(100, 7, 20.0, 3600.0, None, "triple"),
            id="triple-with-quota-policies",
        ),
        pytest.param(
            {
                "X-RateLimit-Limit": "60",
                "X-RateLimit-Remaining": "59",
                "X-RateLimit-Reset": str(EPOCH + 90),
            },
            RateLimitInfo(60, 59, 90.0, None, None, "x-ratelimit"),
            id="x-epoch-seconds",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": str((EPOCH + 12) * 1000)},
            RateLimitInfo(None, 3, 12.0, None, None, "x-ratelimit"),
            id="x-epoch-milliseconds",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "45"},
            RateLimitInfo(60, 0, 45.0, None, None, "x-ratelimit"),
            id="x-delta-seconds",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": str(EPOCH - 50)},
            RateLimitInfo(None, 1, 0.0, None, None, "x-ratelimit"),
            id="x-epoch-in-the-past-is-now",
        ),
        pytest.param(
            {"Retry-After": "120"},
            RateLimitInfo(None, None, None, None, 120.0, "retry-after"),
            id="retry-after-seconds",
        ),
        pytest.param(
            {"Retry-After": format_datetime(NOW + timedelta(seconds=75), usegmt=True)},
            RateLimitInfo(None, None, None, None, 75.0, "retry-after"),
            id="retry-after-http-date",
        ),
        pytest.param(
            {"RateLimit": '"p";r=0;t=30', "Retry-After": "10"},
            RateLimitInfo(None, 0, 30.0, None, 10.0, "draft-08"),
            id="retry-after-alongside",
        ),
        pytest.param(
            {"RateLimit-Limit": " 10\t", "RateLimit-Remaining": "\t2.5 "},
            RateLimitInfo(10, 2, None, None, None, "triple"),
            id="spaces-and-tabs-around-a-number",
        ),
        pytest.param(
            {"RateLimit": "limit=10, remaining=4, reset=-3"},
            RateLimitInfo(10, 4, None, None, None, "draft-07"),
            id="a-negative-reset-dropped-the-rest-kept",
        ),
        pytest.param(
            {"x-RATELIMIT-remaining": "5", "X-RateLimit-RESET": "9"},
            RateLimitInfo(None, 5, 9.0, None, None, "x-ratelimit"),
            id="names-in-any-case",
        ),
        pytest.param(
            {
                "RateLimit": '"p";r=3;t=10',
                "X-RateLimit-Remaining": "99",
                "X-RateLimit-Reset": "100",
            },
            RateLimitInfo(None, 3, 10.0, None, None, "draft-08"),
            id="draft-08-wins-over-older-formats",
        ),
    ],
)
def test_formats(headers: dict[str, str], expected: RateLimitInfo) -> None:
    """Each supported header format reads to the same plain figures."""
    assert parse_ratelimit(headers, NOW) == expected


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="none"),
        pytest.param({"Content-Type": "application/json"}, id="unrelated"),
        pytest.param({"RateLimit": "garbage;;;"}, id="garbage"),
        pytest.param({"RateLimit": '"p";r=-5;t=10'}, id="negative-remaining"),
        pytest.param({"RateLimit-Remaining": "-1"}, id="negative-triple"),
        pytest.param({"X-RateLimit-Limit": "ten"}, id="words"),
        pytest.param({"Retry-After": "soon"}, id="retry-after-words"),
        pytest.param({"Retry-After": "-3"}, id="retry-after-negative"),
        pytest.param({"RateLimit": "limit=?1"}, id="boolean"),
        pytest.param({"RateLimit": '"p";r=1é'}, id="non-ascii"),
        pytest.param({"X-RateLimit-Remaining": "9" * 40}, id="absurdly-long"),
        pytest.param({"RateLimit-Limit": "0.0\x1f"}, id="control-character"),
        pytest.param({"RateLimit-Limit": "5\x0b", "RateLimit-Remaining": "\x1c3"}, id="vt-fs"),
    ],
)
def test_malformed_fields_are_ignored(headers: dict[str, str]) -> None:
    """Missing or malformed fields give None, never an exception."""
    assert parse_ratelimit(headers, NOW) is None


def test_wait_prefers_retry_after_over_reset() -> None:
    """`wait` is Retry-After when present, else the reset."""
    assert RateLimitInfo(reset_after=30.0, retry_after=5.0).wait == 5.0
    assert RateLimitInfo(reset_after=30.0).wait == 30.0
    assert RateLimitInfo().wait is None


header_names = st.sampled_from(
    [
        "RateLimit",
        "RateLimit-Policy",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "X-RateLimit-Reset-After",
        "Retry-After",
        "Date",
    ]
)
sf_like = st.text(alphabet=st.sampled_from(list('abrtqwlimt"=;, -.0123456789?*:()@%')), max_size=60)


@given(
    headers=st.dictionaries(header_names, st.one_of(st.text(max_size=80), sf_like), max_size=8),
    now=st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))),
)
def test_arbitrary_values_never_raise(headers: dict[str, str], now: datetime | None) -> None:
    """Whatever the values, the parser returns figures or None and never raises."""
    info = parse_ratelimit(headers, now)
    if info is not None:
        for value in (info.limit, info.remaining, info.reset_after, info.window, info.retry_after):
            assert value is None or value >= 0


@given(
    headers=st.dictionaries(header_names, st.one_of(st.text(max_size=80), sf_like), max_size=8),
    fallback=st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))),
)
def test_without_a_date_parse_answer_is_parse_at_the_local_time(
    headers: dict[str, str], fallback: datetime | None
) -> None:
    """Without a `Date`, `parse_answer` reads what `parse_ratelimit` reads at the local time."""
    headers.pop("Date", None)
    assert parse_answer(headers, fallback) == parse_ratelimit(headers, fallback)


def http_date(when: datetime) -> str:
    return format_datetime(when, usegmt=True)


@pytest.mark.parametrize(
    "date",
    [
        pytest.param("Fri, 31 Dec 9999 23:59:59 GMT", id="year-9999"),
        pytest.param("Thu, 01 Jan 1970 00:00:00 GMT", id="year-1970"),
        pytest.param(http_date(NOW + timedelta(seconds=MAX_CLOCK_SKEW + 1)), id="just-ahead"),
        pytest.param(http_date(NOW - timedelta(seconds=MAX_CLOCK_SKEW + 1)), id="just-behind"),
        pytest.param("yesterday", id="garbage"),
    ],
)
def test_a_date_far_from_the_local_clock_is_ignored(date: str) -> None:
    """A Date more than MAX_CLOCK_SKEW off: an epoch reset is measured from the local clock."""
    headers = {
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(EPOCH + 30),
        "Retry-After": http_date(NOW + timedelta(seconds=30)),
        "Date": date,
    }
    assert parse_answer(headers, NOW) == RateLimitInfo(None, 0, 30.0, None, 30.0, "x-ratelimit")


def test_without_a_local_clock_no_epoch_nor_date_is_guessed() -> None:
    """With no local time, an epoch reset, an HTTP-date Retry-After and a Date are left out."""
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(EPOCH + 30)}
    headers |= {"Retry-After": http_date(NOW), "Date": http_date(NOW)}
    expected = RateLimitInfo(None, 0, None, None, None, "x-ratelimit")
    assert parse_answer(headers, None) == parse_ratelimit(headers, None) == expected


# Any Date: arbitrary datetimes (mostly far off), ones near the local clock, and garbage.
any_date = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(http_date),
    st.floats(min_value=-2 * MAX_CLOCK_SKEW, max_value=2 * MAX_CLOCK_SKEW).map(
        lambda s: http_date(NOW + timedelta(seconds=s))
    ),
    st.text(max_size=40),
)


@given(date=any_date, ahead=st.integers(min_value=1, max_value=10**6))
def test_a_date_never_shortens_a_reset_and_lengthens_it_at_most_by_the_skew(
    date: str, ahead: int
) -> None:
    """A reset `ahead` s away reads as that, plus the Date's lag when behind by a plausible skew."""
    headers = {
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(EPOCH + ahead),
        "Retry-After": http_date(NOW + timedelta(seconds=ahead)),
        "Date": date,
    }
    info = parse_answer(headers, NOW)
    assert info is not None and info.reset_after is not None and info.retry_after is not None
    server = _http_date(date)
    lag = 0.0 if server is None else (NOW - server).total_seconds()
    expected = ahead + (lag if 0 < lag <= MAX_CLOCK_SKEW else 0.0)
    assert info.reset_after == pytest.approx(expected)
    assert info.retry_after == pytest.approx(expected)
    assert ahead <= info.reset_after <= ahead + MAX_CLOCK_SKEW


counts = st.integers(min_value=0, max_value=10**6)
ROUND_TRIPS = [
    ("draft-08", {"RateLimit": '"d";r={r};t={t}', "RateLimit-Policy": '"d";q={q};w={w}'}),
    ("draft-07", {"RateLimit": "limit={q}, remaining={r}, reset={t}"}),
    (
        "triple",
        {
            "RateLimit-Limit": "{q}, {q};w={w}",
            "RateLimit-Remaining": "{r}",
            "RateLimit-Reset": "{t}",
        },
    ),
    (
        "x-ratelimit",
        {
            "X-RateLimit-Limit": "{q}",
            "X-RateLimit-Remaining": "{r}",
            "X-RateLimit-Reset": "{epoch}",
        },
    ),
]


@pytest.mark.parametrize(("source", "fields"), ROUND_TRIPS, ids=[s for s, _ in ROUND_TRIPS])
@given(limit=counts, remaining=counts, reset=counts, window=st.integers(1, 10**6))
def test_round_trip(
    source: str, fields: dict[str, str], *, limit: int, remaining: int, reset: int, window: int
) -> None:
    """Well-formed fields of each format read back exactly (an epoch reset as the delay)."""
    values = {"q": limit, "r": remaining, "t": reset, "w": window, "epoch": EPOCH + reset}
    headers = {name: value.format(**values) for name, value in fields.items()}
    windowed = float(window) if "{w}" in "".join(fields.values()) else None
    expected = RateLimitInfo(limit, remaining, float(reset), windowed, None, source)
    assert parse_ratelimit(headers, NOW) == expected


@given(seconds=st.integers(min_value=0, max_value=10**7))
def test_retry_after_round_trip(seconds: int) -> None:
    """Retry-After as seconds or as an HTTP-date reads back as the same delay."""
    as_date = format_datetime(NOW + timedelta(seconds=seconds), usegmt=True)
    for value in (str(seconds), as_date):
        info = parse_ratelimit({"Retry-After": value}, NOW)
        assert info is not None
        assert info.retry_after == float(seconds)
