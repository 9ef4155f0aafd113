"""deploy/prometheus-rules.yml: promtool checks and unit-tests it; each alert fires and stays
quiet in a test; it names only exposed metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.docs import DOCS
from support.queries import LOKI_RULES, PROMETHEUS_RULES, ROOT, exposed_metrics, rules

UNIT_TESTS = Path(__file__).with_name("prometheus-rules.test.yml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run does it)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    """`promtool check rules` finds every rule and `promtool test rules` passes."""
    done = _promtool("check", "rules", str(PROMETHEUS_RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules(PROMETHEUS_RULES))} rules found" in done.stdout
    done = _promtool("test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _unit_test_outcomes() -> dict[str, set[bool]]:
    """alert -> the outcomes its unit tests expect (True: fires, False: stays quiet)."""
    outcomes: dict[str, set[bool]] = {}
    lines = UNIT_TESTS.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        named = re.fullmatch(r"\s+alertname: (\S+)", line)
        if named:
            expected = lines[i + 1].strip()
            assert expected.startswith("exp_alerts:"), expected
            outcomes.setdefault(named.group(1), set()).add(expected != "exp_alerts: []")
    return outcomes


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    """Each alert of the rules file has a unit test where it fires and one where it does not."""
    outcomes = _unit_test_outcomes()
    for alert, _ in rules(PROMETHEUS_RULES):
        assert outcomes.get(alert) == {True, False}, alert
    assert set(outcomes) == {alert for alert, _ in rules(PROMETHEUS_RULES)}


def test_rules_name_only_exposed_metrics() -> None:
    """The rules query only metrics the worker exposes (and Prometheus's own `up`)."""
    exposed = exposed_metrics()
    for alert, expr in rules(PROMETHEUS_RULES):
        names = set(re.findall(r"\b(lta_worker_[a-z_]+)", expr))
        assert names or re.fullmatch(r'up\{job="lta-worker"\} == 0', expr), alert
        assert names <= exposed, f"{alert}: {names - exposed}"


def test_the_rules_have_one_home() -> None:
    """No document repeats a rule's expression; docs/operations.md points at both files."""
    for path in (PROMETHEUS_RULES, LOKI_RULES):
        for alert, expr in rules(path):
            for doc in DOCS:
                assert expr not in doc.read_text(encoding="utf-8"), f"{doc.name}: {alert}"
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "deploy/prometheus-rules.yml" in operations
    assert "deploy/loki-rules.yml" in operations
