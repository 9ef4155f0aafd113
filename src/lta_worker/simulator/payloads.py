"""Realistic, opaque payloads for the reads, the same for the same user id (reproducible)."""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from lta_worker.simulator.state import isoformat

_EPOCH = datetime(2024, 6, 1, tzinfo=UTC)
_ENTITIES = ("stock", "type", "accident", "location")
_ACTIONS = ("created", "updated", "deleted")
_UNITS = ("pcs", "kg", "l", "m")


def _rng(user: str, salt: str) -> random.Random:
    # Not for security: a stable seed so that one user id always yields one payload.
    seed = int.from_bytes(hashlib.sha256(f"{salt}:{user}".encode()).digest()[:8], "big")
    return random.Random(seed)


def latest_change(user: str) -> dict[str, Any]:
    """Return the default latest-change payload of `user`."""
    rng = _rng(user, "latest-change")
    entity = rng.choice(_ENTITIES)
    occurred = _EPOCH + timedelta(seconds=rng.randrange(0, 180 * 86400))
    return {
        "id": f"chg_{rng.getrandbits(48):012x}",
        "entity": entity,
        "action": rng.choice(_ACTIONS),
        "occurredAt": isoformat(occurred),
        "source": "cloud-sync",
        "data": {
            "ref": f"{entity}-{rng.randrange(1, 500)}",
            "quantity": rng.randrange(0, 1000),
            "unit": rng.choice(_UNITS),
        },
    }


def stats(user: str) -> dict[str, Any]:
    """Return the default statistics payload of `user`."""
    rng = _rng(user, "stats")
    days = rng.choice((30, 90, 365))
    end = _EPOCH + timedelta(days=rng.randrange(0, 180))
    return {
        "period": {"from": isoformat(end - timedelta(days=days)), "to": isoformat(end)},
        "totals": {
            "changes": rng.randrange(0, 5000),
            "accidents": rng.randrange(0, 20),
            "stocks": rng.randrange(0, 300),
            "types": rng.randrange(1, 40),
        },
        "devices": rng.randrange(1, 5),
        "syncs": rng.randrange(1, 2000),
    }


def defaults(user: str) -> dict[str, Any]:
    """Return both default payloads of `user`, keyed by endpoint."""
    return {"latest-change": latest_change(user), "stats": stats(user)}


def other_endpoint(path: str, user: str) -> dict[str, Any]:
    """A small payload for the public endpoints that accept only a regular user token."""
    rng = _rng(user, path)
    return {"items": [{"id": rng.randrange(1, 10_000)} for _ in range(3)], "next": None}
