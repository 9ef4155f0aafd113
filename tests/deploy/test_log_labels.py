"""The `unit` label of shipped log lines and every LogQL selector agree for the service, the
timer's runs and cron; nothing else is shipped."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from support.queries import DEPLOY, DS_LOKI, logql_queries, stream_selectors, variable

CRON_LABEL = "lta-worker-cron"


def _directive(path: Path, key: str) -> str | None:
    found = re.findall(rf"(?m)^{key}=(.*)$", path.read_text(encoding="utf-8"))
    return found[0].strip() if found else None


def shipped_units() -> set[str]:
    """The units the worker runs under as shipped, and the label cron runs get."""
    units = {p.name for p in DEPLOY.glob("*.service")}
    for timer in DEPLOY.glob("*.timer"):
        units.add(_directive(timer, "Unit") or timer.name.removesuffix(".timer") + ".service")
    return units | {CRON_LABEL}


def cron_identifier() -> str:
    """The journal identifier of cron runs: `systemd-cat -t NAME` in deploy/cron.example."""
    found = re.findall(r"systemd-cat -t ([\w.-]+)", (DEPLOY / "cron.example").read_text("utf-8"))
    assert found, "deploy/cron.example names no systemd-cat identifier"
    assert len(set(found)) == 1
    return str(found[0])


# --- promtail ----------------------------------------------------------------------------


def _relabel_rules() -> list[dict[str, str]]:
    """The items of promtail.yml's `relabel_configs:`, each a dict of its keys."""
    rules: list[dict[str, str]] = []
    inside = False
    for raw in (DEPLOY / "promtail.yml").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line == "relabel_configs:":
            inside = True
            continue
        if not inside or not line or line.startswith("#"):
            continue
        if not line.startswith("- ") and ":" in line and not raw.startswith(" " * 8):
            break  # the next key of the scrape config
        if line.startswith("- "):
            rules.append({})
            line = line[2:]
        key, _, value = line.partition(":")
        rules[-1][key.strip()] = value.strip().strip("'\"")
    return rules


def promtail_unit(journal: dict[str, str]) -> str | None:
    """The `unit` label promtail gives a journal entry, or None when it drops it."""
    labels = {f"__journal_{k.lower()}": v for k, v in journal.items()}
    for rule in _relabel_rules():
        sources = [s.strip() for s in rule["source_labels"].strip("[]").split(",")]
        value = ";".join(labels.get(s, "") for s in sources)
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace") == "keep":
            if match is None:
                return None
        elif match is not None:
            replacement = rule.get("replacement", "$1")
            labels[rule["target_label"]] = match.expand(re.sub(r"\$(\d)", r"\\\1", replacement))
    return labels.get("unit")


def journal_entries() -> list[tuple[dict[str, str], str | None]]:
    """(journal fields, the unit label they must get) per way of running, and another program."""
    ident = cron_identifier()
    entries: list[tuple[dict[str, str], str | None]] = [
        ({"_SYSTEMD_UNIT": unit, "SYSLOG_IDENTIFIER": "lta-worker"}, unit)
        for unit in sorted(shipped_units() - {CRON_LABEL})
    ]
    entries += [
        ({"_SYSTEMD_UNIT": "cron.service", "SYSLOG_IDENTIFIER": ident}, CRON_LABEL),
        ({"_SYSTEMD_UNIT": "session-4.scope", "SYSLOG_IDENTIFIER": ident}, CRON_LABEL),
        ({"_SYSTEMD_UNIT": "sshd.service", "SYSLOG_IDENTIFIER": "sshd"}, None),
        ({"_SYSTEMD_UNIT": "lta-worker-other.service", "SYSLOG_IDENTIFIER": "x"}, None),
    ]
    return entries


@pytest.mark.parametrize(("journal", "unit"), journal_entries(), ids=str)
def test_promtail_labels_each_way_of_running(journal: dict[str, str], unit: str | None) -> None:
    """Promtail labels the service's, timer's and cron's lines and drops other programs' lines."""
    assert promtail_unit(journal) == unit


# --- vector ------------------------------------------------------------------------------


def test_vector_ships_the_units_and_cron() -> None:
    """Vector reads the units (journald) and cron's identifier once each, labels them as
    promtail does, and makes no label of a per-user field."""
    vector = tomllib.loads((DEPLOY / "vector.toml").read_text(encoding="utf-8"))
    assert set(vector["sinks"]["loki"]["labels"]) == {"unit", "host", "event", "level"}
    units = shipped_units() - {CRON_LABEL}
    assert vector["sources"]["lta_journal"]["type"] == "journald"
    assert set(vector["sources"]["lta_journal"]["include_units"]) == units
    cron = vector["sources"]["lta_cron_journal"]
    assert cron["include_matches"] == {"SYSLOG_IDENTIFIER": [cron_identifier()]}
    assert set(cron["exclude_units"]) == units
    remap = vector["transforms"]["lta_json"]
    assert set(remap["inputs"]) == {"lta_journal", "lta_cron_journal"}
    listed = re.search(r"includes\(\[([^\]]*)\], unit\)", remap["source"])
    assert listed is not None
    assert set(re.findall(r'"([^"]+)"', listed.group(1))) == units
    assert f'"{CRON_LABEL}"' in remap["source"]


# --- the queries -------------------------------------------------------------------------


def test_unit_variable_offers_and_matches_every_unit() -> None:
    """The dashboard's `$unit` offers each shipped unit, and its All value matches each."""
    unit = variable("unit")
    assert set(unit["query"].split(",")) == shipped_units()
    for name in shipped_units():
        assert re.fullmatch(unit["allValue"], name), name


def _selected(selector: str, unit: str) -> bool:
    """Whether a LogQL stream selector, `$unit` at its All value, selects `unit`."""
    all_unit = variable("unit")["allValue"]
    for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector):
        if label != "unit":
            continue
        # A LogQL string escapes a backslash as `\\`; the variable's value is inserted raw.
        pattern = value.replace("\\\\", "\\").replace("$unit", all_unit)
        hit = re.fullmatch(pattern, unit) is not None if "~" in op else pattern == unit
        if hit == op.startswith("!"):
            return False
    return True


def _selectors() -> list[tuple[str, str]]:
    out = [(title, s) for title, expr in logql_queries() for s in stream_selectors(expr)]
    host = variable("host")
    assert host["datasource"]["uid"] == DS_LOKI
    out.append(("variable host", host["query"]["stream"]))
    return out


@pytest.mark.parametrize(("title", "selector"), _selectors(), ids=str)
def test_every_log_query_selects_every_unit(title: str, selector: str) -> None:
    """Each stream selector of the dashboard, its variables and Loki rules selects every unit."""
    assert "unit" in selector, f"{title}: no unit selector"
    for unit in sorted(shipped_units()):
        assert _selected(selector, unit), f"{title}: {selector} misses {unit}"


def test_docs_cron_file_source_uses_the_cron_label() -> None:
    """The cron file source of docs/operations.md labels its lines as the shippers do."""
    text = (DEPLOY.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    assert set(re.findall(r"unit: (lta-worker[\w.-]*)", text)) == {CRON_LABEL}
    assert set(re.findall(r'\.unit = "([^"]+)"', text)) == {CRON_LABEL}
