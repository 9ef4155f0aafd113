"""The smallest valid settings data, for the tests of one setting."""

from __future__ import annotations

from typing import Any

BASE: dict[str, dict[str, Any]] = {
    "service": {"base_url": "https://api.example", "auth_url": "https://account.example"},
    "client": {"id": "client-1"},
}


def with_setting(key: str, value: object) -> dict[str, Any]:
    """BASE (copied) with `section.name` set to `value`."""
    section, _, name = key.partition(".")
    data = {s: dict(v) for s, v in BASE.items()}
    data.setdefault(section, {})[name] = value
    return data
