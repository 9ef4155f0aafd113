"""docs/config.md has one row per setting, with its range, the code's default and the environment
variable the loader reads for it (the ranges enforced: tests/config/test_ranges.py)."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lta_worker.config import Settings, field_types, load_settings, parse_duration
from lta_worker.config._fields import ranges, render
from lta_worker.config._loader import _env_overrides  # the name rule alone, before any value
from lta_worker.domain import EVENT_TYPES
from lta_worker.protocol import LONG_TERM_SCOPES
from support.docs import DOCS, fenced, table

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"

# Defaults the table gives in words: the words, and the value they stand for.
WORDED = {
    "client.scopes": ("both long term scopes", LONG_TERM_SCOPES),
    "webhook.events": ("every type", EVENT_TYPES),
}
# Keys whose default is None in the code but filled when the settings load, from the
# environment or systemd's directories (config/_loader.py), as the cell says.
FILLED = {
    "service.token_url": "`{auth_url}/oidc/token`",
    "service.https_proxy": "`$https_proxy`",
    "service.no_proxy": "`$no_proxy`",
    "client.secret_file": "`$CREDENTIALS_DIRECTORY/client-secret`",
    "crypto.key_file": "`$CREDENTIALS_DIRECTORY/token-keys`",
    "enroll.link_key_file": "`$CREDENTIALS_DIRECTORY/enroll-link-key`",
    "webhook.secret_file": "`$CREDENTIALS_DIRECTORY/webhook-secret`",
}


def settings_fields() -> dict[str, dataclasses.Field[Any]]:
    """`section.key` -> the field, for every setting."""
    return {
        f"{section}.{f.name}": f
        for section, model in field_types(Settings).items()
        for f in dataclasses.fields(model)
    }


def doc_rows(text: str) -> dict[str, list[str]]:
    """`section.key` -> the cells of its row, from each `## [section]` table."""
    rows = {}
    for section, part in re.findall(r"^## `\[(\w+)\]`(.*?)(?=^## |\Z)", text, re.M | re.S):
        for line in part.splitlines():
            if line.startswith("| `"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                rows[f"{section}.{cells[0].strip('`')}"] = cells
    return rows


ROWS = doc_rows(DOC.read_text(encoding="utf-8"))
FIELDS = settings_fields()
RANGES = ranges(Settings)
UNITS = {timedelta: "duration", int: "integer", float: "number"}


def test_one_row_per_setting() -> None:
    """Every setting has a row, and every row is a setting."""
    assert sorted(set(FIELDS) - set(ROWS)) == [], "settings without a row"
    assert sorted(set(ROWS) - set(FIELDS)) == [], "rows that are no setting"


def _first_literal(cell: str) -> str:
    found = re.match(r"`([^`]*)`", cell)
    assert found, f"the default cell does not start with a `value`: {cell}"
    return found.group(1)


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_row_states_the_range_default_and_variable(key: str) -> None:
    """A setting's row gives its unit and range (where it has one), its default (in words only
    where listed here) and the environment variable the loader maps to it."""
    section, _, name = key.partition(".")
    overrides, _ = _env_overrides({ROWS[key][3].strip("`"): "x"})
    assert re.fullmatch(r"`LTA_WORKER_\w+`", ROWS[key][3])
    assert overrides == {section: {name: "x"}}
    if key in RANGES:
        low, high = RANGES[key]
        unit = UNITS[field_types(field_types(Settings)[section])[name]]
        assert ROWS[key][1] == f"{unit} {render(low)}\u2013{render(high)}"  # an en dash
    field, cell = FIELDS[key], ROWS[key][2]
    if field.default_factory is not dataclasses.MISSING:
        default: Any = field.default_factory()
    else:
        default = field.default
    if default is dataclasses.MISSING:
        assert cell == "required"
    elif key in WORDED:
        assert (cell, default) == WORDED[key]
    elif key in FILLED:
        assert default is None
        assert cell.startswith(FILLED[key])
    elif default is None:
        assert cell.startswith("unset"), cell
    elif isinstance(default, bool):
        assert _first_literal(cell) == str(default).lower()
    elif isinstance(default, timedelta):
        assert parse_duration(_first_literal(cell)) == default
    elif isinstance(default, int | float):
        assert float(_first_literal(cell)) == default
    else:
        assert _first_literal(cell) == str(default)


def test_credential_table_is_every_secret_file_and_its_credential() -> None:
    """The credential table has one row per `*_file` setting, with the credential filling it."""
    env = {
        "CREDENTIALS_DIRECTORY": "/creds",
        "LTA_WORKER_SERVICE_BASE_URL": "https://api.example",
        "LTA_WORKER_SERVICE_AUTH_URL": "https://auth.example",
        "LTA_WORKER_CLIENT_ID": "c",
        "LTA_WORKER_ENROLL_RETURN_URL": "",  # an [enroll] section, left as by default
        "LTA_WORKER_WEBHOOK_INCLUDE_CONTENT": "false",  # and a [webhook] one
    }
    settings = load_settings(None, env)
    expected = {
        key: f"`{Path(value).name}`" if str(value).startswith("/creds/") else "(set the path)"
        for key in FIELDS
        if key.endswith("_file")
        for value in [getattr(getattr(settings, key.partition(".")[0]), key.partition(".")[2])]
    }
    rows = table(DOC.read_text(encoding="utf-8"), "| file | setting | systemd credential |")
    assert {cells[1].strip("`"): cells[2] for cells in rows} == expected


# Where the variables that are no setting are read: the program, the admin script, the
# benchmarks, the tests and CI.
READERS = [
    ROOT / "src",
    ROOT / "deploy",
    ROOT / "bench",
    ROOT / "tests",
    ROOT / "dev.py",
    ROOT / ".ci",
]


def _read_literally() -> set[str]:
    """Every `LTA_*` name written out in a file that may read it (not the docs)."""
    names: set[str] = set()
    for place in READERS:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in {".md", ".pyc"} or path.name == Path(__file__).name:
                continue
            names |= set(re.findall(r"\bLTA_[A-Z0-9_]+\b", path.read_text("utf-8", "replace")))
    return names


def test_every_variable_the_docs_name_is_read() -> None:
    """Every `LTA_*` variable the docs name is a setting's or read by the code, scripts or tests."""
    texts = DOCS
    named = {n for p in texts for n in re.findall(r"\bLTA_[A-Z0-9_]+\b", p.read_text("utf-8"))}
    literal = _read_literally()
    stale = []
    for name in sorted(named - literal):
        overrides, _ = _env_overrides({name: "x"})
        keys = {f"{s}.{k}" for s, values in overrides.items() for k in values}
        if not keys or not keys <= set(FIELDS):
            stale.append(name)
    assert stale == [], "named in the docs, read nowhere"


@pytest.mark.parametrize(("where", "block"), sorted(fenced("toml").items()))
def test_every_toml_block_holds_valid_settings(where: str, block: str) -> None:
    """Each TOML excerpt of the docs, comments switched on, names real keys with valid values."""
    import tomllib

    from lta_worker.config._fields import REQUIRED, read_section

    data = tomllib.loads(re.sub(r"(?m)^# ?([a-z_]+ = )", r"\1", block))
    errors: list[tuple[str, str]] = []
    read_section(Settings, data, "", errors)
    assert [e for e in errors if e[1] != REQUIRED] == [], where
