"""What B5's `worker(teller=)` is told in place of its estimates' rates: a `Teller`.

`TrueRates` tells each user's true intensity, which splits the worker's gap to the
known-rate oracle into the rule's and the estimates'; `b5_bayes.ModelTold` tells what a
learner told the population's model believes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from lta_worker.domain import ChangeEstimate

# An hour no change is expected in, as one change in 100,000 hours (the plan takes logs).
IDLE_RATE = 1e-5 / 3600


class Teller(Protocol):
    """What `worker` plans and sets due times with in place of its estimates' rates."""

    def rates(self, i: int, est: ChangeEstimate | None, t: float) -> Sequence[float]:
        """User `i`'s changes a second by hour of the day (UTC) at `t` (hours), each at
        least `IDLE_RATE`."""
        ...

    def saw(self, i: int, before: ChangeEstimate | None, after: ChangeEstimate | None) -> None:
        """User `i` was read: its estimate before and after."""
        ...


@dataclass(frozen=True)
class TrueRates:
    """Each user's true intensity (changes an hour)."""

    intensity: Sequence[Sequence[float]]

    def rates(self, i: int, est: ChangeEstimate | None, t: float) -> Sequence[float]:
        """The true rates of the 24 hours from `t`, by hour of the day."""
        intensity, base, last = self.intensity[i], int(t), len(self.intensity[i]) - 1
        return [
            max(intensity[min(base + (h - base) % 24, last)] / 3600, IDLE_RATE) for h in range(24)
        ]

    def saw(self, i: int, before: ChangeEstimate | None, after: ChangeEstimate | None) -> None:
        """Nothing to learn: the truth is known."""


class _Told(ChangeEstimate):
    """An estimate whose rates are a teller's (`worker(teller=)`)."""

    __slots__ = ("told",)
    told: tuple[float, ...]

    def rates(self) -> tuple[float, ...]:
        return self.told


def told(teller: Teller, i: int, est: ChangeEstimate | None, t: float) -> ChangeEstimate:
    """`est` with the rates `teller` tells for user `i` at `t` (hours)."""
    rates = tuple(teller.rates(i, est, t))
    est = est or ChangeEstimate()
    out = _Told(**{f.name: getattr(est, f.name) for f in fields(ChangeEstimate) if f.init})
    object.__setattr__(out, "told", rates)
    return out
