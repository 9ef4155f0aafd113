"""The JSON Schemas of docs/schemas, for the tests that check what the code sends and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def schema(name: str) -> dict[str, Any]:
    """docs/schemas/NAME.schema.json, itself a valid schema."""
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    Draft202012Validator.check_schema(loaded)
    return loaded


def problems(name: str, instance: Any) -> list[str]:
    """Why `instance` does not match docs/schemas/NAME.schema.json (nothing when it does)."""
    validator = Draft202012Validator(
        schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    return sorted(f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(instance))


def webhook_problems(body: Any) -> list[str]:
    """Why a webhook body does not match docs/schemas/webhook-event.schema.json."""
    return problems("webhook-event", body)


def line_problems(line: Any) -> list[str]:
    """Why a `results export` / feed line does not match docs/schemas/result-line.schema.json."""
    return problems("result-line", line)
