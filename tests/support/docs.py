"""Readers of the Markdown docs for the doc-vs-code tests: tables and fenced blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def read(name: str) -> str:
    """The text of README.md or docs/NAME (a path relative to the checkout)."""
    return (ROOT / name).read_text(encoding="utf-8")


def table(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the first table whose header line starts with `header`."""
    rows = []
    for line in text[text.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def block_after(text: str, lang: str, heading: str) -> str:
    """The first ```LANG block after `heading` in `text`."""
    found = re.search(rf"^```{lang}\n(.*?)^```", text[text.index(heading) :], re.M | re.S)
    assert found, f"no {lang} block after {heading}"
    return found.group(1)


def fenced(lang: str) -> dict[str, str]:
    """Every ```LANG block of README.md and docs/*.md, keyed by where it is (FILE:LINE)."""
    blocks = {}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for found in re.finditer(rf"^```{lang}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, found.start()) + 1
            blocks[f"{doc.relative_to(ROOT)}:{line}"] = found.group(1)
    return blocks
