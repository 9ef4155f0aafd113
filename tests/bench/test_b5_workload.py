"""B5's populations as data: the workload file's parser, the generators and `--workload`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.b5_freshness import POLICIES, run
from bench.b5_workload import (
    Workload,
    WorkloadError,
    WorkloadUser,
    dumps,
    hourly_intensity,
    load,
    parse,
)
from hypothesis import given
from hypothesis import strategies as st

from bench import runner, workloads


@st.composite
def _workloads(draw: st.DrawFn) -> Workload:
    days = draw(st.integers(1, 3))
    hours = st.floats(0, days * 24, exclude_max=True, allow_nan=False)
    rate = st.floats(0, 50, allow_nan=False)
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
    users = []
    for name in names:
        intensity = draw(
            st.none()
            | st.lists(rate, min_size=24, max_size=24)
            | st.lists(rate, min_size=24 * days, max_size=24 * days)
        )
        users.append(
            WorkloadUser(
                name,
                draw(st.sampled_from(["idle", "heavy", "cls é"])),
                tuple(sorted(draw(st.lists(hours, max_size=20)))),
                None if intensity is None else tuple(intensity),
            )
        )
    return Workload(days, tuple(users))


@given(_workloads())
def test_a_workload_survives_a_round_trip(workload: Workload) -> None:
    """What `dumps` writes, `parse` reads back equal (names, classes, changes, intensity)."""
    assert parse(dumps(workload).splitlines()) == workload


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**308, max_value=10**400)  # beyond a float
    | st.floats()
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_keys = st.sampled_from(["days", "user", "class", "changes", "intensity"])


@given(
    st.lists(
        st.dictionaries(_keys, _json, max_size=5).map(json.dumps)
        | st.text(max_size=30)
        | st.just('{"days": 1}'),
        max_size=5,
    )
)
def test_any_text_parses_or_names_its_fault(lines: list[str]) -> None:
    """Whatever the lines hold, parsing returns a workload or raises WorkloadError, no other."""
    message = "w.jsonl"
    try:
        parse(lines, "w.jsonl")
    except WorkloadError as exc:
        message = str(exc)
    assert message.startswith("w.jsonl")


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("", None, "empty"),
        ('{"days": 0}\n{"user": "a", "class": "x", "changes": []}', 1, "days"),
        ('{"days": 2, "users": 3}', 1, "days"),
        ('{"days": 100000}\n{"user": "a", "class": "x", "changes": []}', 1, "366"),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": [1' + "0" * 400 + "]}", 2, "numbers"),
        ('[2]\n{"user": "a", "class": "x", "changes": []}', 1, "JSON object"),
        ('{"days": 1}', None, "no users"),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": [1,', 2, "not JSON"),
        ('{"days": 1}\n{"class": "x", "changes": []}', 2, '"user"'),
        ('{"days": 1}\n{"user": "a", "changes": []}', 2, '"class"'),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": ["1"]}', 2, "numbers"),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": [24]}', 2, "[0, 24)"),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": [], "rate": 1}', 2, "unknown"),
        ('{"days": 2}\n{"user": "a", "class": "x", "changes": [], "intensity": [1]}', 2, "48"),
        ('{"days": 1}\n{"user": "a", "class": "x", "changes": [NaN]}', 2, "numbers"),
        (
            '{"days": 1}\n{"user": "a", "class": "x", "changes": []}\n\n'
            '{"user": "a", "class": "y", "changes": []}',
            4,
            "twice",
        ),
    ],
)
def test_a_malformed_workload_names_its_line(text: str, line: int | None, says: str) -> None:
    """Each malformed file is a WorkloadError naming `file:line` and what is wrong there."""
    with pytest.raises(WorkloadError) as caught:
        parse(text.splitlines(), "pop.jsonl")
    message = str(caught.value)
    assert message.startswith("pop.jsonl:" if line is None else f"pop.jsonl:{line}:"), message
    assert says in message


def test_intensity_of_one_day_repeats_and_realised_changes_stand_in() -> None:
    """24 rates repeat every day; without any, the realised changes by hour of day, per day."""
    day = tuple(float(h) for h in range(24))
    w = Workload(2, (WorkloadUser("a", "x", (), day), WorkloadUser("b", "x", (3.5, 27.2, 30.0))))
    assert hourly_intensity(w, w.users[0]) == list(day) * 2
    realised = hourly_intensity(w, w.users[1])
    assert realised[3] == realised[27] == 1.0  # two changes at 03:xx over two days
    assert realised[6] == realised[30] == 0.5
    assert sum(realised) == 3.0


def test_bench_run_rejects_a_malformed_workload_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench/run --only B5 --workload BAD` exits 2 with the line named, no traceback."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"days": 1}\n{"user": "a", "class": "x", "changes": "soon"}\n')
    out = tmp_path / "r.json"
    assert runner.main(["--only", "B5", "--workload", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "Traceback" not in err
    assert not out.exists()


def test_bench_run_wants_b5_with_a_workload(tmp_path: Path) -> None:
    """`--workload` without B5 among the benchmarks is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as caught:
        runner.main(["--only", "B4", "--workload", str(tmp_path / "w.jsonl")])
    assert caught.value.code == 2


def test_b5_on_a_workload_file_reports_the_four_policies_per_class(tmp_path: Path) -> None:
    """B5 on a written `sessions` file: per budget, four policies, four figures, each class."""
    path = tmp_path / "tiny.jsonl"
    assert workloads.main(["--write", str(path), "--users", "12", "--days", "3"]) == 0
    written = load(path)
    assert all(u.intensity is not None and len(u.intensity) == 72 for u in written.users)
    result = run("smoke", workload_file=path)
    section = result.extra["workloads"]["tiny"]
    assert sorted(section["budgets"]) == ["100", "200", "400", "800"]
    keys = {"mean_delay_h", "p95_delay_h", "longest_unread_h", "budget_used"}
    for figures in section["budgets"].values():
        assert set(POLICIES) <= set(figures) and "learner_told_model" not in figures
        for policy in POLICIES:
            assert keys <= set(figures[policy])
            classes = figures[policy]["classes"]
            assert set(classes) == {u.cls for u in written.users}
            assert all(keys <= set(c) for c in classes.values())
    json.dumps(section)  # what results.json will hold


def test_night_changes_come_only_in_quiet_hours_at_their_share_and_idle_users_stay_idle() -> None:
    """`--night 0.3`: added changes only in quiet hours, at 0.3 of the waking rate; idle: none."""
    base = workloads.waking(40, 4)
    night = workloads.with_nights(base, 0.3)
    added = 0
    for was, now in zip(base.users, night.users, strict=True):
        rates, more = hourly_intensity(base, was), hourly_intensity(night, now)
        extra = sorted(set(now.changes) - set(was.changes))
        assert all(rates[int(t)] == 0 for t in extra)
        assert all(
            m == pytest.approx(r or 0.3 * max(rates)) for r, m in zip(rates, more, strict=True)
        )
        assert extra == [] or max(rates) > 0
        added += len(extra)
    assert added > 0
    assert workloads.with_nights(base, 0.3) == night  # seeded


def test_the_generated_populations_are_seeded() -> None:
    """The same size and seed give the same population; the kinds differ in classes."""
    for make in workloads.KINDS.values():
        assert make(30, 4) == make(30, 4)
    assert {u.cls for u in workloads.waking(200, 4).users} == {"idle", "light", "ordinary", "busy"}
    kinds = {u.cls for u in workloads.sessions(200, 4).users}
    assert kinds == {"idle", "sleeper", "shifting", "bursty", "steady"}
