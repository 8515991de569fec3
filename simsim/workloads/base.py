"""What every part of a workload shares: the request limit, argument checks, and the
protocols of arrival processes and length distributions."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from simsim.checks import check_int
from simsim.clock import check_count

__all__ = [
    "MAX_GENERATED_REQUESTS",
    "ArrivalProcess",
    "IntArray",
    "LengthDistribution",
    "check_request_count",
    "check_seed",
]

IntArray = npt.NDArray[np.int64]
"""A one-dimensional NumPy array of ``int64``."""

# Draws are real numbers until they are rounded; anything past this bound (2**62, exact in
# float64) cannot become an int64 safely and is either clipped (lengths) or refused (times).
_FLOAT_LIMIT = float(2**62)


MAX_GENERATED_REQUESTS = 10_000_000
"""The most requests one workload may make (a closed loop: users, and users times
``requests_per_user``).

A run holds every request in memory, about 1 GB per million on the fast engine (more on
the others), so a larger count is almost surely a slip of the keyboard; it is refused
before anything is drawn or allocated.
"""
_HELD_IN_MEMORY = "every request is held in memory, about 1 GB per million"

# ---------------------------------------------------------------------- validation


def check_request_count(value: object, name: str) -> int:
    """*value* as how many requests (or users) a workload makes: an ``int`` from 1 to
    :data:`MAX_GENERATED_REQUESTS`.

    A workload of none makes an empty run, which is almost always a mistake: 0 is
    refused (``ValueError``) as a too large count is; ``bool`` and non-integers raise
    ``TypeError``.
    """
    count = check_count(value, name, minimum=1)
    if count > MAX_GENERATED_REQUESTS:
        raise ValueError(
            f"{name} must be at most {MAX_GENERATED_REQUESTS:,} ({_HELD_IN_MEMORY}), got {count:,}"
        )
    return count


def check_seed(seed: object) -> int:
    """Return *seed* as a plain ``int`` from 0 to ``2**63 - 1`` (NumPy integers accepted):
    :func:`simsim.checks.check_int`'s rule and messages."""
    return check_int(seed, "seed")


def _distribution(value: object, name: str) -> LengthDistribution:
    if not isinstance(value, LengthDistribution):
        raise TypeError(
            f"{name} must be a length distribution (an object with sample(rng, count)), "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _set(instance: object, name: str, value: object) -> None:
    # Frozen dataclasses normalise their own fields in __post_init__.
    object.__setattr__(instance, name, value)


# ---------------------------------------------------------------------- protocols


@runtime_checkable
class ArrivalProcess(Protocol):
    """Anything that turns a random generator into *count* arrival times.

    ``arrival_times_us(rng, count, start_us)`` returns a non-decreasing ``int64`` array of
    *count* microsecond timestamps, all at or after *start_us*.
    """

    def arrival_times_us(
        self, rng: np.random.Generator, count: int, start_us: int = 0
    ) -> IntArray: ...


@runtime_checkable
class LengthDistribution(Protocol):
    """Anything that draws non-negative integers: token counts or microsecond durations.

    ``sample(rng, count)`` returns an ``int64`` array of *count* values, each >= 0.
    """

    def sample(self, rng: np.random.Generator, count: int) -> IntArray: ...
