"""Length distributions: non-negative integers for token counts and durations (patience,
think times): fixed, uniform, log-normal, exponential and empirical (from a table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from simsim.checks import check_real
from simsim.clock import check_count
from simsim.traces import TraceError, TracePath, parse_count, parse_weight, read_table
from simsim.workloads.base import (
    _FLOAT_LIMIT,
    IntArray,
    _set,
)

__all__ = ["Empirical", "Exponential", "Fixed", "LogNormal", "Uniform"]


def _bounds(low: object, high: object) -> tuple[int, int | None]:
    low = check_count(low, "low")
    if high is None:
        return low, None
    high = check_count(high, "high")
    if high < low:
        raise ValueError(f"high must be >= low, got low={low}, high={high}")
    return low, high


def _round_and_clip(values: npt.NDArray[np.float64], low: int, high: int | None) -> IntArray:
    """Round to the nearest integer (ties to even), then clip to ``[low, high]``."""
    upper = _FLOAT_LIMIT if high is None else min(float(high), _FLOAT_LIMIT)
    clipped = np.clip(np.rint(values), float(low), upper)
    result = clipped.astype(np.int64)
    if high is not None:
        # float(high) may round up past high for huge bounds; the integer clip is exact.
        np.minimum(result, np.int64(high), out=result)
    return result


@dataclass(frozen=True, slots=True)
class Fixed:
    """Always the same non-negative integer *value* (uses no randomness)."""

    value: int

    def __post_init__(self) -> None:
        _set(self, "value", check_count(self.value, "value"))

    def sample(self, rng: np.random.Generator, count: int) -> IntArray:
        """*count* copies of ``value``."""
        return np.full(check_count(count, "count"), self.value, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers drawn uniformly from ``low`` to ``high``, both ends included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        low, high = _bounds(self.low, self.high)
        assert high is not None
        _set(self, "low", low)
        _set(self, "high", high)

    def sample(self, rng: np.random.Generator, count: int) -> IntArray:
        """*count* independent uniform integers in ``[low, high]``."""
        count = check_count(count, "count")
        return rng.integers(self.low, self.high, size=count, endpoint=True, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A log-normal distribution described by its own mean and CV, rounded and clipped.

    ``mean`` and ``cv`` are those of the log-normal itself (not of the underlying normal):
    ``sigma**2 = log(1 + cv**2)`` and ``mu = log(mean) - sigma**2 / 2``. Each draw is
    rounded to the nearest integer (ties to even), then clipped to ``[low, high]``
    (``high=None``: no upper clip). Clipping and rounding shift the mean slightly when
    ``low``/``high`` cut into the distribution. ``cv = 0`` always gives ``round(mean)``.
    """

    mean: float
    """Mean of the (unrounded, unclipped) distribution (> 0)."""
    cv: float
    """Coefficient of variation of the (unrounded, unclipped) distribution (>= 0)."""
    low: int = 0
    """Smallest value returned (>= 0)."""
    high: int | None = None
    """Largest value returned, or ``None`` for no upper clip."""

    def __post_init__(self) -> None:
        _set(self, "mean", check_real(self.mean, "mean", positive=True))
        _set(self, "cv", check_real(self.cv, "cv", positive=False))
        if not self.cv * self.cv < math.inf:
            # log(1 + cv**2) would be infinite and every draw NaN.
            raise ValueError(
                f"cv = {self.cv!r} is out of range: cv**2 must be a finite float "
                "(roughly cv < 1e154)"
            )
        low, high = _bounds(self.low, self.high)
        _set(self, "low", low)
        _set(self, "high", high)

    def sample(self, rng: np.random.Generator, count: int) -> IntArray:
        """*count* independent draws, rounded and clipped to ``[low, high]``."""
        count = check_count(count, "count")
        if self.cv == 0:
            # exp(log(mean)) need not give mean back exactly; a constant must.
            return _round_and_clip(np.full(count, self.mean), self.low, self.high)
        sigma2 = math.log1p(self.cv * self.cv)
        mu = math.log(self.mean) - sigma2 / 2
        return _round_and_clip(
            rng.lognormal(mu, math.sqrt(sigma2), size=count), self.low, self.high
        )


@dataclass(frozen=True, slots=True)
class Exponential:
    """An exponential distribution with the given ``mean``, rounded and clipped.

    Each draw is rounded to the nearest integer (ties to even), then clipped to
    ``[low, high]``. Handy for client patience and think times in microseconds.
    """

    mean: float
    """Mean of the (unrounded, unclipped) distribution (> 0)."""
    low: int = 0
    """Smallest value returned (>= 0)."""
    high: int | None = None
    """Largest value returned, or ``None`` for no upper clip."""

    def __post_init__(self) -> None:
        _set(self, "mean", check_real(self.mean, "mean", positive=True))
        low, high = _bounds(self.low, self.high)
        _set(self, "low", low)
        _set(self, "high", high)

    def sample(self, rng: np.random.Generator, count: int) -> IntArray:
        """*count* independent draws, rounded and clipped to ``[low, high]``."""
        count = check_count(count, "count")
        return _round_and_clip(rng.exponential(self.mean, size=count), self.low, self.high)


@dataclass(frozen=True, slots=True)
class Empirical:
    """Values drawn from a table, with replacement, in proportion to their weights.

    ``values`` are non-negative integers (repeats allowed: a value listed twice is twice
    as likely); ``weights``, if given, are non-negative finite numbers, one per value,
    with a positive sum. Without weights every listed value is equally likely, so a
    column of observed token counts reproduces their distribution.
    """

    values: Sequence[int]
    """The table of possible values (at least one); stored as a tuple."""
    weights: Sequence[float] | None = None
    """Relative weight of each value, or ``None`` for equal weights; stored as a tuple."""
    _values: IntArray = field(init=False, repr=False, compare=False)
    _probabilities: npt.NDArray[np.float64] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.values, str | bytes) or not isinstance(
            self.values, Sequence | np.ndarray
        ):
            raise TypeError(
                f"values must be a sequence of non-negative ints, got {type(self.values).__name__}"
            )
        values = tuple(check_count(v, f"values[{i}]") for i, v in enumerate(self.values))
        if not values:
            raise ValueError("values must hold at least one value, got an empty sequence")
        _set(self, "values", values)
        _set(self, "_values", np.array(values, dtype=np.int64))
        if self.weights is None:
            _set(self, "_probabilities", None)
            return
        if isinstance(self.weights, str | bytes) or not isinstance(
            self.weights, Sequence | np.ndarray
        ):
            raise TypeError(
                f"weights must be a sequence of numbers or None, got {type(self.weights).__name__}"
            )
        weights = tuple(
            check_real(w, f"weights[{i}]", positive=False) for i, w in enumerate(self.weights)
        )
        if len(weights) != len(values):
            raise ValueError(
                f"weights must have one entry per value: {len(values)} values, "
                f"{len(weights)} weights"
            )
        try:
            total = math.fsum(weights)
        except OverflowError:
            raise ValueError(
                "weights must have a finite sum, got weights whose sum passes the float "
                f"limit (largest {max(weights)!r}); scale them down"
            ) from None
        if not total > 0:
            raise ValueError(f"weights must have a positive sum, got {total!r}")
        _set(self, "weights", weights)
        _set(self, "_probabilities", np.array(weights, dtype=np.float64) / total)

    @classmethod
    def from_csv(
        cls,
        path: TracePath,
        column: str,
        *,
        weight_column: str | None = None,
    ) -> Empirical:
        """Read the table from *column* of a CSV file with a header row.

        Every non-blank row gives one value (a non-negative integer); *weight_column*,
        if named, gives its weight. Blank lines are skipped. A missing column, a bad cell
        or a file with no rows raises :class:`simsim.traces.TraceError` naming the file,
        the line and the column.
        """
        wanted = (column,) if weight_column is None else (column, weight_column)
        source, columns, rows = read_table(path, wanted, other_columns=True)
        values = tuple(
            parse_count(cells[columns[column]], source, line, column) for line, cells in rows
        )
        if weight_column is None:
            return cls(values)
        weights = tuple(
            parse_weight(cells[columns[weight_column]], source, line, weight_column)
            for line, cells in rows
        )
        if not math.fsum(weights) > 0:
            raise TraceError(source, "the weights sum to 0", column=weight_column)
        return cls(values, weights)

    def sample(self, rng: np.random.Generator, count: int) -> IntArray:
        """*count* independent draws from ``values`` (with replacement)."""
        count = check_count(count, "count")
        return rng.choice(self._values, size=count, replace=True, p=self._probabilities)
