"""Arrival processes: Poisson, gamma (bursty), fixed-rate and staged constant-rate arrival
times.

Gaps are drawn as real numbers of microseconds, summed, and each cumulative offset from the
start is rounded once to the nearest microsecond, ties to even (``numpy.rint``), so
rounding never accumulates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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

__all__ = ["FixedRateArrivals", "GammaArrivals", "PoissonArrivals", "Stage", "StagedArrivals"]


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


_WHOLE_TOLERANCE = 1e-9
"""A stage's ``rate * duration`` within this of an integer counts as that integer, so
that ``0.3`` requests/s for 10 s make 3 requests although ``0.3`` is not exact in binary."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a :class:`StagedArrivals` load: ``rate_per_s`` for ``duration_us``."""

    rate_per_s: float
    """Requests per simulated second in this stage (> 0)."""
    duration_us: int
    """How long the stage lasts, in microseconds (>= 1)."""

    def __post_init__(self) -> None:
        _set(self, "rate_per_s", check_real(self.rate_per_s, "rate_per_s", positive=True))
        duration = check_time_us(self.duration_us, "duration_us")
        if duration < 1:
            raise ValueError("duration_us must be >= 1 microsecond, got 0")
        _set(self, "duration_us", duration)

    @property
    def request_count(self) -> int:
        """How many requests the stage makes: ``rate_per_s * duration`` in seconds, rounded
        down (a product within 1e-9 of an integer counts as that integer), as
        inference-perf counts a stage's requests."""
        return math.floor(self.rate_per_s * self.duration_us / 1e6 + _WHOLE_TOLERANCE)


@dataclass(frozen=True, slots=True)
class StagedArrivals:
    """A staged constant-rate load, inference-perf's ``constant`` load type: stages run
    back to back, stage *k* at ``rate_per_s`` for ``duration_us``, evenly spaced.

    Stage *k* starts at the end of the stage before it (the first at ``start_us``) and
    makes :attr:`Stage.request_count` requests, its j-th (j = 1, 2, ...) at
    ``stage start + j * 1e6 / rate_per_s``, rounded once to the nearest microsecond, ties
    to even: the first one period after the stage starts, the last at its end when
    ``rate * duration`` is whole. It uses no randomness. The process is finite: it makes
    :attr:`count` requests, and asking for more is an error. ``stages`` takes
    :class:`Stage` s or ``(rate_per_s, duration_us)`` pairs and is stored as a tuple of
    :class:`Stage`.

    inference-perf's own ``constant`` timer draws a stage's gaps at random (exponential,
    rescaled to fill the stage exactly) and starts a stage only once every request of the
    one before has finished; simsim keeps the even, back-to-back schedule the stages
    describe (``docs/scenarios.md`` compares the two).
    """

    stages: Sequence[Stage | tuple[float, int]]

    def __post_init__(self) -> None:
        if isinstance(self.stages, str | bytes) or not isinstance(self.stages, Sequence):
            raise TypeError(
                "stages must be a sequence of Stage or (rate_per_s, duration_us) pairs, "
                f"got {type(self.stages).__name__} {self.stages!r}"
            )
        stages: list[Stage] = []
        for index, stage in enumerate(self.stages):
            if isinstance(stage, Stage):
                stages.append(stage)
            elif isinstance(stage, tuple) and len(stage) == 2:
                try:
                    stages.append(Stage(*stage))
                except (TypeError, ValueError) as error:
                    raise type(error)(f"stages[{index}]: {error}") from None
            else:
                raise TypeError(
                    f"stages[{index}] must be a Stage or a (rate_per_s, duration_us) pair, "
                    f"got {stage!r}"
                )
        if not stages:
            raise ValueError("stages must hold at least one stage, got none")
        total_us = sum(stage.duration_us for stage in stages)
        if total_us > MAX_TIME_US:
            raise OverflowError(
                f"the stages last {total_us} us in all, past the 64-bit limit 2**63 - 1"
            )
        _set(self, "stages", tuple(stages))

    @property
    def count(self) -> int:
        """How many requests the stages make in all."""
        return sum(stage.request_count for stage in self._stages())

    def _stages(self) -> tuple[Stage, ...]:
        return self.stages  # type: ignore[return-value]  # normalised in __post_init__

    def stage_starts_us(self, start_us: int = 0) -> list[int]:
        """When each stage starts, the first at *start_us*."""
        start_us = check_time_us(start_us, "start_us")
        starts = []
        for stage in self._stages():
            starts.append(start_us)
            start_us += stage.duration_us
        return starts

    def stage_indices(self, count: int) -> list[int]:
        """The stage of each of the first *count* requests (0 for the first stage)."""
        return [index for index, _ in self._positions(count)]

    def positions_in_stage(self, count: int) -> list[int]:
        """Each of the first *count* requests' place in its own stage (0 for a stage's
        first request)."""
        return [position for _, position in self._positions(count)]

    def _positions(self, count: int) -> list[tuple[int, int]]:
        count = self._check_count(count)
        pairs: list[tuple[int, int]] = []
        for index, stage in enumerate(self._stages()):
            take = min(stage.request_count, count - len(pairs))
            pairs.extend((index, position) for position in range(take))
        return pairs

    def _check_count(self, count: int) -> int:
        count = check_count(count, "count")
        if count > self.count:
            raise ValueError(
                f"count must be at most {self.count}, the requests the stages make "
                f"(rate x duration per stage), got {count}"
            )
        return count

    def arrival_times_us(self, rng: np.random.Generator, count: int, start_us: int = 0) -> IntArray:
        """The first *count* arrival times from *start_us* (``int64``, non-decreasing);
        *rng* is unused. *count* may not pass :attr:`count`."""
        count = self._check_count(count)
        starts = self.stage_starts_us(start_us)
        parts: list[IntArray] = []
        left = count
        for stage, stage_start in zip(self._stages(), starts, strict=True):
            take = min(stage.request_count, left)
            if take == 0:
                continue
            offsets = np.arange(1, take + 1, dtype=np.float64) * 1e6 / stage.rate_per_s
            parts.append(_arrivals_from_offsets(offsets, stage_start))
            left -= take
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts)
