"""What every part of a workload shares: the request limit, argument checks, and the
protocols of arrival processes and length distributions."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

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
    """Return *seed* as a plain ``int``: a non-negative integer (NumPy integers accepted).

    ``bool`` and non-integers raise ``TypeError``; negative values raise ``ValueError``.
    """
    if isinstance(seed, bool):
        raise TypeError(f"seed must be a non-negative int, got bool {seed!r}")
    try:
        value = int(operator.index(seed))  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"seed must be a non-negative int, got {type(seed).__name__} {seed!r}"
        ) from None
    if value < 0:
        raise ValueError(f"seed must be >= 0, got {value}")
    return value


def _real(value: object, name: str, *, positive: bool) -> float:
    """A finite real number as ``float``: > 0 when *positive*, else >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {result!r}")
    if positive and result <= 0:
        raise ValueError(f"{name} must be > 0, got {result!r}")
    if result < 0:
        raise ValueError(f"{name} must be >= 0, got {result!r}")
    return result


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
