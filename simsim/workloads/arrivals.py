"""Arrival processes: Poisson, gamma (bursty) and fixed-rate arrival times.

Gaps are drawn as real numbers of microseconds, summed, and each cumulative offset from the
start is rounded once to the nearest microsecond, ties to even (``numpy.rint``), so
rounding never accumulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from simsim.checks import check_real
from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.workloads.base import (
    _FLOAT_LIMIT,
    IntArray,
    _set,
)

__all__ = ["FixedRateArrivals", "GammaArrivals", "PoissonArrivals"]


def _arrivals_from_offsets(offsets_us: npt.NDArray[np.float64], start_us: int) -> IntArray:
    """Round each cumulative offset to the nearest microsecond (ties to even) and shift."""
    if offsets_us.size and not offsets_us[-1] <= _FLOAT_LIMIT:
        raise OverflowError(
            f"the last arrival would be {offsets_us[-1]:.6g} us after start_us, past the "
            "64-bit time range"
        )
    rounded = np.rint(offsets_us).astype(np.int64)
    if rounded.size and start_us + int(rounded[-1]) > MAX_TIME_US:
        raise OverflowError(
            f"the last arrival would be at {start_us + int(rounded[-1])} us, past the 64-bit "
            "limit 2**63 - 1"
        )
    return rounded + np.int64(start_us)


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """A Poisson process: independent exponential gaps with mean ``1e6 / rate_per_s`` us.

    The inter-arrival gaps have a coefficient of variation (CV) of 1. The first request
    arrives one gap after ``start_us``; the k-th arrival is ``start_us`` plus the sum of k
    gaps, rounded to the nearest microsecond, ties to even (``numpy.rint``).
    """

    rate_per_s: float
    """Mean arrivals per simulated second (> 0)."""

    def __post_init__(self) -> None:
        _set(self, "rate_per_s", check_real(self.rate_per_s, "rate_per_s", positive=True))

    def arrival_times_us(self, rng: np.random.Generator, count: int, start_us: int = 0) -> IntArray:
        """*count* arrival times after *start_us* (``int64``, non-decreasing)."""
        count = check_count(count, "count")
        start_us = check_time_us(start_us, "start_us")
        gaps = rng.exponential(1e6 / self.rate_per_s, size=count)
        return _arrivals_from_offsets(np.cumsum(gaps), start_us)


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """A renewal process with Gamma-distributed gaps: Poisson's rate, a chosen burstiness.

    Gaps have mean ``1e6 / rate_per_s`` us and coefficient of variation ``cv``: shape
    ``1 / cv**2`` and scale ``mean * cv**2``. ``cv > 1`` is burstier than Poisson (clusters
    of close arrivals separated by long lulls), ``cv = 1`` has Poisson's gap distribution,
    ``cv < 1`` is more regular. Times are cumulative offsets from ``start_us``, each
    rounded to the nearest microsecond, ties to even (``numpy.rint``).
    """

    rate_per_s: float
    """Mean arrivals per simulated second (> 0)."""
    cv: float
    """Coefficient of variation (standard deviation / mean) of the gaps (> 0)."""

    def __post_init__(self) -> None:
        _set(self, "rate_per_s", check_real(self.rate_per_s, "rate_per_s", positive=True))
        _set(self, "cv", check_real(self.cv, "cv", positive=True))
        squared = self.cv * self.cv
        # shape = 1 / cv**2 and scale = mean gap * cv**2 must both be positive finite floats.
        if not (0 < squared < math.inf and 1 / squared < math.inf):
            raise ValueError(
                f"cv = {self.cv!r} is out of range: the gaps' gamma shape 1/cv**2 must be a "
                "positive finite float (roughly 1e-154 < cv < 1e154)"
            )
        if not (1e6 / self.rate_per_s) * squared < math.inf:
            raise ValueError(
                f"rate_per_s = {self.rate_per_s!r} and cv = {self.cv!r} give an infinite gamma "
                "scale (mean gap * cv**2): use a higher rate or a lower cv"
            )

    def arrival_times_us(self, rng: np.random.Generator, count: int, start_us: int = 0) -> IntArray:
        """*count* arrival times after *start_us* (``int64``, non-decreasing)."""
        count = check_count(count, "count")
        start_us = check_time_us(start_us, "start_us")
        shape = 1.0 / (self.cv * self.cv)
        scale = (1e6 / self.rate_per_s) / shape
        gaps = rng.gamma(shape, scale, size=count)
        return _arrivals_from_offsets(np.cumsum(gaps), start_us)


@dataclass(frozen=True, slots=True)
class FixedRateArrivals:
    """Evenly spaced arrivals: the k-th (k = 1, 2, ...) at ``start_us + k * 1e6 / rate_per_s``.

    It uses no randomness. Each time is computed from k directly (not by summing gaps)
    and rounded to the nearest microsecond, ties to even (``numpy.rint``); with a period
    that is a whole number of microseconds every gap is exactly that period.
    """

    rate_per_s: float
    """Arrivals per simulated second (> 0)."""

    def __post_init__(self) -> None:
        _set(self, "rate_per_s", check_real(self.rate_per_s, "rate_per_s", positive=True))

    def arrival_times_us(self, rng: np.random.Generator, count: int, start_us: int = 0) -> IntArray:
        """*count* arrival times after *start_us* (``int64``, non-decreasing); *rng* is unused."""
        count = check_count(count, "count")
        start_us = check_time_us(start_us, "start_us")
        offsets = np.arange(1, count + 1, dtype=np.float64) * 1e6 / self.rate_per_s
        return _arrivals_from_offsets(offsets, start_us)
