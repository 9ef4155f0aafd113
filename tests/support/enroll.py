"""Small helpers shared by the enrollment tests and the enrollment commands' tests."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


def query_of(url: str) -> dict[str, str]:
    """The query parameters of a URL, one value each."""
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def write_private(path: Path, text: str) -> Path:
    """Write a file readable by its owner only (mode 0600)."""
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def basic(client_id: str, secret: str) -> str:
    """An HTTP Basic Authorization value."""
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()
