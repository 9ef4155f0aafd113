"""The operations files in deploy/ agree with the code and the documented contracts."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lta_worker.config import (
    Settings,
    field_types,
    load_settings,
    read_section,
)
from support.queries import (
    DS_LOKI,
    DS_PROMETHEUS,
    dashboard,
    exposed_metrics,
    logql_queries,
    panels,
    query_events,
    query_fields,
    targets,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EVENTS_DOC = ROOT / "docs" / "log-events.md"
EXAMPLE = DEPLOY / "config.example.toml"
SERVICE = DEPLOY / "lta-worker.service"
RUN_SERVICE = DEPLOY / "lta-worker-run.service"
TIMER = DEPLOY / "lta-worker-run.timer"

MAX_EXPOSURE = 1.5
COMMON_FIELDS = frozenset({"event", "level", "ts", "logger"})
# Stream labels set by deploy/promtail.yml and deploy/vector.toml (not JSON fields).
STREAM_LABELS = frozenset({"unit", "host", "job"})


# --- docs/log-events.md ------------------------------------------------------------------


def _documented_events() -> dict[str, dict[str, set[str]]]:
    """event -> field -> documented values (empty when the doc lists none)."""
    events: dict[str, dict[str, set[str]]] = {}
    for line in EVENTS_DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.fullmatch(r"`[a-z_.]+`", cells[0]):
            continue
        fields: dict[str, set[str]] = {}
        # "`name` (`v1`, `v2`)" -> name with its values; "(HTTP status or null)" -> no values.
        for match in re.finditer(r"`([a-z_]+)`(?:\s*\(([^)]*)\))?", cells[3]):
            fields[match.group(1)] = set(re.findall(r"`([^`]+)`", match.group(2) or ""))
        events[cells[0].strip("`")] = fields
    return events


EVENTS = _documented_events()


# --- deploy/grafana-dashboard.json -------------------------------------------------------


def _target_params() -> list[Any]:
    """Every LogQL query shipped: the dashboard's and the Loki rules'."""
    return [
        pytest.param(title, expr, id=f"{title}-{n}")
        for n, (title, expr) in enumerate(logql_queries())
    ]


def test_dashboard_has_loki_input_and_panels() -> None:
    """The dashboard's panels use its Loki and Prometheus inputs; Loki queries parse the JSON."""
    board = dashboard()
    assert board["schemaVersion"] >= 36
    inputs = {i["name"]: i for i in board["__inputs"]}
    assert inputs["DS_LOKI"]["pluginId"] == "loki"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    loki, prometheus = panels(DS_LOKI), panels(DS_PROMETHEUS)
    assert len(loki) + len(prometheus) == len([p for p in board["panels"] if p["type"] != "row"])
    for panel in loki:
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_LOKI}", panel["title"]
            assert "| json" in target["expr"], panel["title"]
    for panel in prometheus:
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_dashboard_covers_the_operational_questions() -> None:
    """Reads, 429s, budget, pass duration, user states, revocations, breaker, pass outcomes."""
    queried = {event for _, expr in targets(DS_LOKI) for event in query_events(expr)}
    assert {
        "poll.read",
        "ratelimit.throttled",
        "pass.finished",
        "service.heartbeat",
        "token.deleted",
        "user.state_changed",
        "pass.breaker_tripped",
    } <= queried
    unwrapped = {f for _, e in targets(DS_LOKI) for f in re.findall(r"unwrap\s+(\w+)", e)}
    assert {"budget_remaining", "wall_s", "active", "parked", "unlinked", "rejected"} <= unwrapped


@pytest.mark.parametrize(("title", "expr"), _target_params())
def test_dashboard_queries_only_documented_events_and_fields(title: str, expr: str) -> None:
    """Each dashboard or Loki rule query names documented events, fields and values only."""
    events = query_events(expr)
    unknown = events - set(EVENTS)
    assert not unknown, f"{title}: events not in docs/log-events.md: {unknown}"
    if events:
        allowed: dict[str, set[str]] = {}
        for event in events:
            for field, values in EVENTS[event].items():
                allowed.setdefault(field, set()).update(values)
    else:
        allowed = {f: set() for e in EVENTS.values() for f in e}
    for field, values in query_fields(expr).items():
        if field in COMMON_FIELDS or field in STREAM_LABELS:
            continue
        assert field in allowed, f"{title}: field {field!r} is not documented for {events}"
        if allowed[field] and values:
            assert values <= allowed[field], (
                f"{title}: {field} compared to {values - allowed[field]}"
            )


# --- log shipping ------------------------------------------------------------------------


def _promtail_labels() -> set[str]:
    """Names under every `- labels:` pipeline stage of deploy/promtail.yml."""
    names: set[str] = set()
    lines = (DEPLOY / "promtail.yml").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "- labels:":
            continue
        indent = len(line) - len(line.lstrip())
        for nxt in lines[i + 1 :]:
            if not nxt.strip() or nxt.strip().startswith("#"):
                continue
            if len(nxt) - len(nxt.lstrip()) <= indent:
                break
            names.add(nxt.strip().split(":")[0])
    return names


def test_promtail_labels_only_event_and_level() -> None:
    """Promtail makes event and level labels, never user or another per-user field (Vector:
    test_log_labels.py)."""
    assert _promtail_labels() == {"event", "level"}


# --- deploy/config.example.toml ----------------------------------------------------------


def _uncommented(text: str) -> str:
    """The example with its commented-out `# key = value` lines switched on."""
    return re.sub(r"(?m)^# ?([a-z_]+ = )", r"\1", text)


def test_config_example_lists_every_key_valid_at_its_default() -> None:
    """Every key is in the example, set or commented out, and valid switched on; each key set
    holds its default, and keys without one are commented out."""
    text = EXAMPLE.read_text(encoding="utf-8")
    data = tomllib.loads(_uncommented(text))
    model = {section: set(field_types(sub)) for section, sub in field_types(Settings).items()}
    assert {section: set(values) for section, values in data.items()} == model
    errors: list[tuple[str, str]] = []
    assert read_section(Settings, data, "", errors) is not None, errors  # each key valid
    data, settings = tomllib.loads(text), load_settings(EXAMPLE, env={})
    for section, model in field_types(Settings).items():
        assert isinstance(model, type) and dataclasses.is_dataclass(model)
        for field in dataclasses.fields(model):
            key = field.name
            if field.default is dataclasses.MISSING:
                assert key in data[section], f"{section}.{key} is required"
            elif field.default is None:
                assert key not in data[section], f"{section}.{key} has no default: comment it"
            else:
                actual = getattr(getattr(settings, section), key)
                assert actual == field.default, f"{section}.{key}: {actual!r}"


# --- systemd units -----------------------------------------------------------------------


def _directives(path: Path) -> dict[str, list[str]]:
    """Directive -> every value it is given, across sections, ignoring comments."""
    out: dict[str, list[str]] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


SANDBOX = {
    "DynamicUser": "yes",
    "StateDirectory": "lta-worker",
    "ProtectSystem": "strict",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "UMask": "0077",
}


def test_service_unit_has_required_directives() -> None:
    """lta-worker.service: notify + watchdog, no restart on exit 78, sandbox."""
    d = _directives(SERVICE)
    assert d["Type"] == ["notify"]
    assert d["NotifyAccess"] == ["main"]
    assert d["WatchdogSec"] == ["60s"]
    assert d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["78"]
    assert d["ExecStart"][0].endswith(" --config /etc/lta-worker/config.toml serve")
    for key, value in SANDBOX.items():
        assert d[key] == [value], key
    # TimeoutStopSec must cover serve.grace_period (10 s) with room for the last commit.
    assert int(d["TimeoutStopSec"][0].removesuffix("s")) >= 20


# Every secret file the config finds under $CREDENTIALS_DIRECTORY when its setting is unset,
# by setting, with the credential name it is read under.
SECRET_FILES = {
    ("client", "secret_file"): "client-secret",
    ("crypto", "key_file"): "token-keys",
    ("webhook", "secret_file"): "webhook-secret",
    ("enroll", "link_key_file"): "enroll-link-key",
}


@pytest.mark.parametrize("unit", [SERVICE, RUN_SERVICE], ids=lambda p: p.name)
def test_units_pass_every_secret_file_the_config_reads(unit: Path, tmp_path: Path) -> None:
    """Each unit passes exactly the secret files the config reads (optional ones unset)."""
    d = _directives(unit)
    loaded = dict(line.split(":", 1) for line in d["LoadCredential"])
    optional = {line.split(":", 1)[0] for line in d.get("SetCredential", [])}
    data = {
        "service": {"base_url": "https://api.example", "auth_url": "https://a.example"},
        "client": {"id": "c", "redirect_uri": "http://127.0.0.1:8080/lta/callback"},
        "webhook": {"url": "https://app.example/hook"},
        "enroll": {"listen": "127.0.0.1:8080", "public_url": "http://127.0.0.1:8080"},
    }
    path = tmp_path / "config.toml"
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())
            for name, values in data.items()
        ).replace("'", '"')
    )
    env = {"CREDENTIALS_DIRECTORY": "/run/credentials/lta-worker.service"}
    settings = load_settings(path, env=env)
    for (section, key), name in SECRET_FILES.items():
        assert str(getattr(getattr(settings, section), key)).endswith(f"/{name}"), key
    assert loaded == {name: f"/etc/lta-worker/{name}" for name in SECRET_FILES.values()}
    assert optional == {"webhook-secret", "enroll-link-key"}


def test_run_unit_and_timer_have_required_directives() -> None:
    """lta-worker-run.service is a sandboxed one-shot `run`; the timer is persistent, jittered."""
    d = _directives(RUN_SERVICE)
    assert d["Type"] == ["oneshot"]
    assert " run --max-duration " in d["ExecStart"][0]
    assert d["SuccessExitStatus"] == ["75"]
    t = _directives(TIMER)
    assert t["Persistent"] == ["true"]
    assert "RandomizedDelaySec" in t
    assert "OnCalendar" in t or "OnUnitActiveSec" in t


def test_units_share_one_sandbox() -> None:
    """The timer's one-shot unit has exactly the service unit's hardening directives."""
    skip = {
        "Description", "Type", "NotifyAccess", "WatchdogSec", "ExecStart", "ExecReload",
        "Restart", "RestartSec", "RestartPreventExitStatus", "StartLimitIntervalSec",
        "StartLimitBurst", "TimeoutStartSec", "SuccessExitStatus", "WantedBy",
        "LimitNOFILE",  # for serve's listeners, which the one-shot run has none of
    }  # fmt: skip
    service = {k: v for k, v in _directives(SERVICE).items() if k not in skip}
    run = {k: v for k, v in _directives(RUN_SERVICE).items() if k not in skip}
    assert service == run


def test_cron_example_never_overlaps() -> None:
    """The cron line wraps `lta-worker run` in `flock -n`, so runs never overlap."""
    lines = [
        line
        for line in (DEPLOY / "cron.example").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#") and "lta-worker" in line and " run" in line
    ]
    assert len(lines) == 1
    assert "flock -n" in lines[0]
    assert lines[0].index("flock") < lines[0].index("lta-worker --config")


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)"
)


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False
    )


def _offline_supported() -> bool:
    probe = _analyze("security", "--help")
    return "--offline" in probe.stdout


@needs_systemd_analyze
@pytest.mark.parametrize("unit", [SERVICE, RUN_SERVICE], ids=lambda p: p.name)
def test_unit_exposure_at_most_1_5(unit: Path) -> None:
    """`systemd-analyze security --offline=true` rates the unit's exposure 1.5 or lower."""
    if not _offline_supported():
        pytest.skip("this systemd-analyze has no --offline (needs systemd 250 or newer)")
    result = _analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


@needs_systemd_analyze
def test_units_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the service, the run unit and the timer."""
    # verify insists that ExecStart exists: point it at this environment's lta-worker.
    exe = shutil.which("lta-worker") or str(Path(sys.executable).parent / "lta-worker")
    if not Path(exe).exists():
        exe = "/bin/true"
    paths = []
    for unit in (SERVICE, RUN_SERVICE, TIMER):
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text(encoding="utf-8").replace("/usr/local/bin/lta-worker", exe))
        paths.append(str(copy))
    result = _analyze("verify", "--man=no", *paths)
    if result.returncode != 0 and "System has not been booted with systemd" in result.stderr:
        pytest.skip("systemd-analyze verify cannot run here: " + result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lta-worker" not in result.stderr, result.stderr


# What an operator reads first, from metrics alone.
FIRST_READ = {
    "lta_worker_budget_remaining",  # budget left
    "lta_worker_reads_total",  # reads by outcome
    "lta_worker_users",  # users by state
    "lta_worker_last_pass_success_timestamp_seconds",  # last successful pass
    "lta_worker_webhook_backlog",
    "lta_worker_pending_drops",
    "lta_worker_schedule_expected_delay_seconds",  # adaptive schedule
}
# ... and further down, among the log panels.
ALSO_QUERIED = {
    "lta_worker_pass_duration_seconds_bucket",
    "lta_worker_pacer_wait_seconds_count",
    "lta_worker_breaker_trips_total",
}


def _queried(board_panels: list[dict[str, Any]]) -> set[str]:
    """The metric names the panels' queries use."""
    exprs = [t["expr"] for p in board_panels for t in p["targets"]]
    return {name for expr in exprs for name in re.findall(r"\b(lta_worker_[a-z_]+)", expr)}


def test_dashboard_reads_first_from_metrics_the_worker_exposes() -> None:
    """Prometheus panels name only exposed metrics; those above the log panels answer the
    first questions alone, so the dashboard works without Loki."""
    exposed = exposed_metrics()
    for panel in panels(DS_PROMETHEUS):
        names = _queried([panel])
        assert names <= exposed, f"{panel['title']}: {names - exposed}"
    assert _queried(panels(DS_PROMETHEUS)) >= FIRST_READ | ALSO_QUERIED
    board = dashboard()["panels"]
    first_log = min(p["gridPos"]["y"] for p in panels(DS_LOKI))
    above = [p for p in board if p["type"] != "row" and p["gridPos"]["y"] < first_log]
    assert above
    assert all(p["datasource"]["uid"] == DS_PROMETHEUS for p in above)
    assert _queried(above) >= FIRST_READ, FIRST_READ - _queried(above)
