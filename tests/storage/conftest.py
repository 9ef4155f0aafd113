"""Fixtures of the storage tests."""

from __future__ import annotations

import pytest

from lta_worker.storage import Vault
from support.storage import keyring


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))
