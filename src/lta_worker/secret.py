"""A wrapper that keeps secret strings out of reprs, logs, tracebacks and f-strings."""

from __future__ import annotations

from typing import Final

_MASK: Final = "**********"


class Secret:
    """Holds a secret string; only `reveal()` gives it back.

    `str()`, `repr()` and `format()` show a mask, so a secret that reaches a log line, an
    exception message or a rendered traceback by mistake shows nothing.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """Return the secret value. Call this only where the value goes on the wire or to disk."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    def __str__(self) -> str:
        return _MASK

    def __format__(self, spec: str) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret cannot be pickled")
