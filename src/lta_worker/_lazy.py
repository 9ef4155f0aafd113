"""Lazy public faces: a package names what it offers, and imports a module on first use.

A package's `__init__` maps public names to the private modules that define them and sets
`__getattr__ = lazy_attributes(__name__, NAMES)` (PEP 562). `lta-worker run` with nothing
due, `status` and the web application that only enrolls users then import only what they
use (SQLAlchemy, httpx and cryptography cost most of a one-shot command's start-up).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `names[name]` (relative to `package`) on first use.

    Args:
        package: The package's `__name__`.
        names: Public name -> module that defines it (`"._store"`).

    Returns:
        The `__getattr__` function; the value found is cached in the package's namespace.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
