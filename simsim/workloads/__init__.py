"""Seeded workload generators: when requests arrive, how long they are, how long clients wait.

Everything here turns one integer seed into the same requests on every machine (for a
given NumPy version): each random quantity is drawn from its own child stream of
``numpy.random.SeedSequence(seed)``, through ``numpy.random.default_rng`` (PCG64). Because
the streams are separate, changing one ingredient leaves the others alone: adding a
patience distribution to a workload does not move a single arrival or token count.

Three kinds of parts fit together:

* **Arrival processes** (:class:`PoissonArrivals`, :class:`GammaArrivals`,
  :class:`FixedRateArrivals`) give arrival times. Gaps are drawn as real numbers of
  microseconds, summed, and each cumulative offset from the start is rounded once to the
  nearest microsecond, ties to even (``numpy.rint``), so rounding never accumulates.
* **Length distributions** (:class:`Fixed`, :class:`Uniform`, :class:`LogNormal`,
  :class:`Exponential`, :class:`Empirical`) give non-negative integers: prompt and output
  token counts, and durations in microseconds (client patience, think times).
* **Workloads** combine them. :class:`OpenLoopWorkload` makes a fixed list of requests
  (and patience deadlines) up front; :class:`ClosedLoopWorkload` runs one SimPy process
  per user who submits, waits for the answer, thinks, and asks again; :class:`ClassMix`
  merges several :class:`RequestClass` es (interactive chat beside batch jobs, say), each
  with its own arrivals, sizes and metadata (class, tenant, priority, deadline, tags).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers
import operator
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import simpy

from simsim.clock import MAX_TIME_US, Environment, check_count, check_time_us
from simsim.engines.batching import KvCacheConfig
from simsim.request import Request
from simsim.traces import TraceError, TracePath, parse_count, parse_weight, read_table

__all__ = [
    "MAX_GENERATED_REQUESTS",
    "ArrivalProcess",
    "ClassMix",
    "ClosedLoopRun",
    "ClosedLoopSubmission",
    "ClosedLoopWorkload",
    "Empirical",
    "Exponential",
    "Fixed",
    "FixedRateArrivals",
    "GammaArrivals",
    "GeneratedWorkload",
    "LengthDistribution",
    "LogNormal",
    "OpenLoopWorkload",
    "PatienceDeadline",
    "PoissonArrivals",
    "RequestClass",
    "SharedPrefixes",
    "Uniform",
    "WorkloadEngine",
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


# ---------------------------------------------------------------------- arrivals


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
        _set(self, "rate_per_s", _real(self.rate_per_s, "rate_per_s", positive=True))

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
        _set(self, "rate_per_s", _real(self.rate_per_s, "rate_per_s", positive=True))
        _set(self, "cv", _real(self.cv, "cv", positive=True))
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
        _set(self, "rate_per_s", _real(self.rate_per_s, "rate_per_s", positive=True))

    def arrival_times_us(self, rng: np.random.Generator, count: int, start_us: int = 0) -> IntArray:
        """*count* arrival times after *start_us* (``int64``, non-decreasing); *rng* is unused."""
        count = check_count(count, "count")
        start_us = check_time_us(start_us, "start_us")
        offsets = np.arange(1, count + 1, dtype=np.float64) * 1e6 / self.rate_per_s
        return _arrivals_from_offsets(offsets, start_us)


# ---------------------------------------------------------------------- lengths


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
        _set(self, "mean", _real(self.mean, "mean", positive=True))
        _set(self, "cv", _real(self.cv, "cv", positive=False))
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
        _set(self, "mean", _real(self.mean, "mean", positive=True))
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
            _real(w, f"weights[{i}]", positive=False) for i, w in enumerate(self.weights)
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


# ---------------------------------------------------------------------- engines


class WorkloadEngine(Protocol):
    """What a workload needs from a server: ``SimulationEngine`` and its siblings fit."""

    @property
    def env(self) -> Environment:
        """The environment the server runs on."""
        ...

    @property
    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        ...

    @property
    def requests(self) -> Mapping[int, Request]:
        """Every submitted request by id."""
        ...

    def submit(self, request: Request) -> Request:
        """Hand a pristine request to the server."""
        ...

    def cancel_request(self, request_id: int) -> None:
        """Cancel a request that is not terminal."""
        ...

    def completion(self, request_id: int) -> simpy.Event:
        """An event that succeeds with the request once it is terminal."""
        ...


def _canceller(engine: WorkloadEngine, request_id: int) -> Callable[[simpy.Event], None]:
    def cancel_if_still_running(_event: simpy.Event) -> None:
        if not engine.requests[request_id].is_terminal:
            engine.cancel_request(request_id)

    return cancel_if_still_running


# ---------------------------------------------------------------------- open loop


class PatienceDeadline(NamedTuple):
    """A client's deadline: cancel *request_id* at *time_us* if it has not finished."""

    time_us: int
    request_id: int


@dataclass(frozen=True, slots=True)
class GeneratedWorkload:
    """The output of :meth:`OpenLoopWorkload.generate`: requests and patience deadlines.

    ``requests`` are fresh, pristine :class:`Request` objects in id order (which is also
    arrival order); ``cancellations`` are the patience deadlines, ``(time_us, request_id)``
    sorted by time then id (empty without a patience distribution). The requests can be
    submitted to one engine only, since the engine then owns them.
    """

    requests: tuple[Request, ...]
    cancellations: tuple[PatienceDeadline, ...] = ()

    def submit_to(self, engine: WorkloadEngine) -> None:
        """Submit every request to *engine* and schedule the patience deadlines.

        Each deadline becomes a timeout on ``engine.env`` whose callback cancels the
        request if it is not terminal by then. Requests are submitted first, then the
        deadlines are scheduled (in ``cancellations`` order), so at a shared microsecond T
        the arrivals at T come first, then the deadlines, then everything the run itself
        schedules at T: a request that completes exactly at its deadline is cancelled
        (it must finish strictly before it). Everything is checked before anything is
        submitted: ``ValueError`` for an id the engine already knows or an arrival before
        ``engine.now_us``.
        """
        now = engine.now_us
        known = engine.requests
        for request in self.requests:
            if request.request_id in known:
                raise ValueError(
                    f"request {request.request_id} was already submitted to this engine"
                )
            if request.arrival_time_us < now:
                raise ValueError(
                    f"request {request.request_id} arrives at {request.arrival_time_us} us, "
                    f"before the engine's current time {now} us"
                )
            if not request.is_pristine or request._pending is not None:
                raise ValueError(
                    f"request {request.request_id} was already submitted (state "
                    f"{request.state.name}); generate the workload again for a new engine"
                )
        for request in self.requests:
            engine.submit(request)
        env = engine.env
        for deadline in self.cancellations:
            timer = env.timeout(deadline.time_us - env.now)
            timer.callbacks.append(_canceller(engine, deadline.request_id))


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """Shared system prompts: every request starts with one of a few common prefixes.

    Group *k* is a prefix of ``lengths[k]`` tokens, chosen with probability
    proportional to ``weights[k]`` (all equal by default). A request's prompt is its
    group's prefix followed by its own drawn prompt tokens, and it names its full KV
    blocks of ``block_size_tokens`` (use the KV cache's) with ``block_hashes``: the
    prefix's full blocks ``("g<k>", i)`` (shared by the whole group), then blocks of its
    own ``("r<request_id>", i)``. The block holding the end of the prefix and the start
    of the request's own tokens is the request's own.

    With ``total_blocks`` (the KV cache's size), a request whose prompt and output limit
    need more blocks than the whole cache could never run: it is refused
    (``ValueError`` naming it) before a single block hash is made, since a prompt that
    large would cost one hash per block first.

    With ``block_hashes=False`` the requests are the same (the same groups, prompts and
    sizes from the same seed) but name no blocks: the baseline for a server without a
    prefix cache, which refuses hashes it would not use.
    """

    lengths: Sequence[int]
    block_size_tokens: int
    weights: Sequence[float] | None = None
    total_blocks: int | None = None
    block_hashes: bool = True
    """Whether each request names its full blocks (``False``: the same requests for a
    server without a prefix cache)."""

    def __post_init__(self) -> None:
        lengths = tuple(check_count(length, "shared prefix length") for length in self.lengths)
        if not lengths:
            raise ValueError("lengths must name at least one shared prefix")
        _set(self, "lengths", lengths)
        _set(
            self,
            "block_size_tokens",
            check_count(self.block_size_tokens, "block_size_tokens", minimum=1),
        )
        if self.weights is not None:
            weights = tuple(_real(w, "weight", positive=False) for w in self.weights)
            if len(weights) != len(lengths) or not sum(weights) > 0:
                raise ValueError(
                    f"weights must give one non-negative weight per prefix ({len(lengths)}) "
                    f"with a positive sum, got {list(self.weights)}"
                )
            _set(self, "weights", weights)
        if self.total_blocks is not None:
            _set(self, "total_blocks", check_count(self.total_blocks, "total_blocks", minimum=1))
        if type(self.block_hashes) is not bool:
            raise TypeError(f"block_hashes must be True or False, got {self.block_hashes!r}")

    def apply(
        self,
        rng: np.random.Generator,
        request_ids: Sequence[int],
        prompts: Sequence[int],
        outputs: Sequence[int] | None = None,
    ) -> tuple[list[int], list[tuple[tuple[str, int], ...] | None]]:
        """Each request's full prompt length and block hashes (``None`` for every
        request with ``block_hashes=False``), its group drawn from *rng*.

        With ``total_blocks``, every request (its full prompt and its output limit from
        *outputs*, 0 without) is checked against the cache before any hash is made.
        """
        weights = None
        if self.weights is not None:
            total = sum(self.weights)
            weights = [w / total for w in self.weights]
        groups = rng.choice(len(self.lengths), size=len(prompts), p=weights).tolist()
        full_prompts = [
            self.lengths[group] + own for own, group in zip(prompts, groups, strict=True)
        ]
        if self.total_blocks is not None:
            # Every size first: a request that cannot fit is refused before any hash.
            cache = KvCacheConfig(self.block_size_tokens, self.total_blocks)
            limits = [0] * len(full_prompts) if outputs is None else outputs
            for rid, total_tokens, output in zip(request_ids, full_prompts, limits, strict=True):
                cache.check_fits(rid, total_tokens, output)
        if not self.block_hashes:
            return full_prompts, [None] * len(full_prompts)
        block = self.block_size_tokens
        hashes: list[tuple[tuple[str, int], ...] | None] = []
        for rid, total_tokens, group in zip(request_ids, full_prompts, groups, strict=True):
            shared = self.lengths[group] // block
            keys = [(f"g{group}", i) for i in range(shared)]
            keys += [(f"r{rid}", i) for i in range(shared, total_tokens // block)]
            hashes.append(tuple(keys))
        return full_prompts, hashes


@dataclass(frozen=True, slots=True)
class OpenLoopWorkload:
    """A fixed number of requests whose arrivals do not depend on the server.

    Request ``first_request_id + i`` is the i-th arrival of ``arrivals`` (from
    ``start_us``), with a prompt drawn from ``prompt_tokens`` and an output limit drawn
    from ``output_tokens``. With ``patience``, the client cancels a request that has not
    finished ``patience`` microseconds after its arrival (a deadline of
    ``arrival + patience``).

    :meth:`generate` draws arrivals, prompts, outputs and patience from four child
    streams of ``SeedSequence(seed)``, in that order, so each is unaffected by the others;
    with ``shared_prefixes``, each request's prefix group comes from a fifth, and its
    prompt is the group's prefix followed by the drawn prompt tokens.
    """

    arrivals: ArrivalProcess
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    count: int
    patience: LengthDistribution | None = None
    """Microseconds a client waits before cancelling, or ``None`` for endless patience."""
    first_request_id: int = 0
    start_us: int = 0
    shared_prefixes: SharedPrefixes | None = None
    """Shared system prompts in front of every prompt (for a prefix cache), or ``None``."""

    def __post_init__(self) -> None:
        if self.shared_prefixes is not None and not isinstance(
            self.shared_prefixes, SharedPrefixes
        ):
            raise TypeError(
                f"shared_prefixes must be SharedPrefixes or None, got {self.shared_prefixes!r}"
            )
        if not isinstance(self.arrivals, ArrivalProcess):
            raise TypeError(
                "arrivals must be an arrival process (an object with arrival_times_us), "
                f"got {type(self.arrivals).__name__} {self.arrivals!r}"
            )
        _distribution(self.prompt_tokens, "prompt_tokens")
        _distribution(self.output_tokens, "output_tokens")
        if self.patience is not None:
            _distribution(self.patience, "patience")
        _set(self, "count", check_request_count(self.count, "count"))
        first = check_count(self.first_request_id, "first_request_id")
        if first + self.count - 1 > MAX_TIME_US:
            raise OverflowError(
                f"request ids {first} to {first + self.count - 1} pass the 64-bit limit"
            )
        _set(self, "first_request_id", first)
        _set(self, "start_us", check_time_us(self.start_us, "start_us"))

    def generate(self, seed: int) -> GeneratedWorkload:
        """The requests and deadlines this workload makes from *seed* (a non-negative int).

        The same seed gives the same result on every machine and every call.
        """
        seed = check_seed(seed)
        arrival_seq, prompt_seq, output_seq, patience_seq = np.random.SeedSequence(seed).spawn(4)
        count = self.count
        arrivals = self.arrivals.arrival_times_us(
            np.random.default_rng(arrival_seq), count, self.start_us
        )
        prompts = self.prompt_tokens.sample(np.random.default_rng(prompt_seq), count)
        outputs = self.output_tokens.sample(np.random.default_rng(output_seq), count)
        first = self.first_request_id
        if self.shared_prefixes is None:
            requests = tuple(
                Request(first + i, arrival, prompt, output)
                for i, (arrival, prompt, output) in enumerate(
                    zip(arrivals.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
                )
            )
        else:
            # A fifth stream: the four above draw exactly what they draw without it.
            group_seq = np.random.SeedSequence(seed).spawn(5)[4]
            ids = [first + i for i in range(count)]
            full, hashes = self.shared_prefixes.apply(
                np.random.default_rng(group_seq), ids, prompts.tolist(), outputs.tolist()
            )
            requests = tuple(
                Request(rid, arrival, prompt, output, block_hashes=keys)
                for rid, arrival, prompt, output, keys in zip(
                    ids, arrivals.tolist(), full, outputs.tolist(), hashes, strict=True
                )
            )
        deadlines: list[PatienceDeadline] = []
        if self.patience is not None:
            patience = self.patience.sample(np.random.default_rng(patience_seq), count)
            for request, wait_us in zip(requests, patience.tolist(), strict=True):
                deadline = request.arrival_time_us + wait_us
                if deadline > MAX_TIME_US:
                    raise OverflowError(
                        f"request {request.request_id}: deadline {deadline} us is past the "
                        "64-bit limit 2**63 - 1"
                    )
                deadlines.append(PatienceDeadline(deadline, request.request_id))
            deadlines.sort()
        return GeneratedWorkload(requests, tuple(deadlines))

    def submit_to(self, engine: WorkloadEngine, seed: int) -> GeneratedWorkload:
        """Generate from *seed*, submit to *engine* (see :meth:`GeneratedWorkload.submit_to`).

        Returns the generated workload, whose requests the engine now updates.
        """
        generated = self.generate(seed)
        generated.submit_to(engine)
        return generated


# ---------------------------------------------------------------------- classes of requests


def _class_seed(seed: int, name: str) -> int:
    """A class's own seed: a child of ``SeedSequence(seed)`` keyed by the class's *name*.

    Keyed by name, not position, so adding, removing or reordering other classes leaves
    this class's draws unchanged. The spawn key (four 32-bit words of the name's
    SHA-256) never equals a plain ``spawn()`` child's one-word key.
    """
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    words = tuple(int.from_bytes(digest[i : i + 4], "big") for i in range(0, 16, 4))
    sequence = np.random.SeedSequence(seed, spawn_key=words)
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def _optional_name(value: object, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One class of traffic in a :class:`ClassMix`: its arrivals, sizes and metadata.

    The class draws like an :class:`OpenLoopWorkload` of its own (arrivals, prompts,
    outputs, patience), and every request it makes carries ``request_class = name``,
    ``tenant``, ``priority``, ``tags`` and, with ``relative_deadline_us``, the absolute
    ``deadline_us = arrival_time_us + relative_deadline_us``. Give ``count`` (how many
    requests) or ``share`` (its part of the mix's ``total``), not both; with neither, the
    mix's ``total`` is split in proportion to the classes' arrival rates.

    ``ttft_slo_us`` and ``tpot_slo_us`` are the class's latency targets: they change no
    draw and no request, and are what reports judge the class by
    (:meth:`ClassMix.slo_targets`).
    """

    name: str
    arrivals: ArrivalProcess
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    count: int | None = None
    share: float | None = None
    """This class's weight in the mix's ``total`` (any positive number; weights are
    normalised over the classes)."""
    tenant: str | None = None
    priority: int = 0
    """Lower runs first under the ``priority`` scheduler (as in vLLM); may be negative."""
    relative_deadline_us: int | None = None
    """Each request's deadline, in microseconds after its arrival (``None``: none)."""
    tags: Mapping[str, Any] | None = None
    patience: LengthDistribution | None = None
    """Microseconds a client waits before cancelling, or ``None`` for endless patience."""
    ttft_slo_us: float | None = None
    tpot_slo_us: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a request class needs a non-empty str name, got {self.name!r}")
        where = f"class {self.name!r}"
        if not isinstance(self.arrivals, ArrivalProcess):
            raise TypeError(
                f"{where}: arrivals must be an arrival process (an object with "
                f"arrival_times_us), got {type(self.arrivals).__name__} {self.arrivals!r}"
            )
        _distribution(self.prompt_tokens, f"{where}: prompt_tokens")
        _distribution(self.output_tokens, f"{where}: output_tokens")
        if self.patience is not None:
            _distribution(self.patience, f"{where}: patience")
        if self.count is not None and self.share is not None:
            raise ValueError(f"{where}: give count or share, not both")
        if self.count is not None:
            _set(self, "count", check_request_count(self.count, f"{where}: count"))
        if self.share is not None:
            _set(self, "share", _real(self.share, f"{where}: share", positive=True))
        _optional_name(self.tenant, f"{where}: tenant")
        if isinstance(self.priority, bool) or not hasattr(type(self.priority), "__index__"):
            raise TypeError(f"{where}: priority must be an int, got {self.priority!r}")
        _set(self, "priority", int(operator.index(self.priority)))
        if self.relative_deadline_us is not None:
            _set(
                self,
                "relative_deadline_us",
                check_time_us(self.relative_deadline_us, f"{where}: relative_deadline_us"),
            )
        if self.tags is not None:
            if not isinstance(self.tags, Mapping) or not all(
                type(key) is str and key for key in self.tags
            ):
                raise TypeError(
                    f"{where}: tags must be a mapping with non-empty str keys, got {self.tags!r}"
                )
            _set(self, "tags", MappingProxyType(dict(self.tags)))
        for key in ("ttft_slo_us", "tpot_slo_us"):
            value = getattr(self, key)
            if value is not None:
                _set(self, key, _real(value, f"{where}: {key}", positive=False))

    @property
    def slo_target(self) -> tuple[float | None, float | None]:
        """``(ttft_slo_us, tpot_slo_us)``: the class's latency targets (``None``: none)."""
        return (self.ttft_slo_us, self.tpot_slo_us)


def _split_total(total: int, weights: Sequence[float]) -> list[int]:
    """*total* split in proportion to *weights*, summing exactly to *total*.

    Largest remainder: every part gets the floor of its exact share, and the units
    left over go to the largest fractional parts, ties to the earlier class.
    """
    whole = math.fsum(weights)
    exact = [total * weight / whole for weight in weights]
    parts = [math.floor(value) for value in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - parts[i]), i))
    for index in order[: total - sum(parts)]:
        parts[index] += 1
    return parts


@dataclass(frozen=True, slots=True)
class ClassMix:
    """Open-loop traffic made of several :class:`RequestClass` es, merged in arrival order.

    Every class draws its own requests, from its own seed (a child of the mix's seed
    keyed by the class's name, see :meth:`generate`), from ``start_us``. The requests
    of all classes are then merged by ``(arrival_time_us, class order, draw order)``
    and numbered from ``first_request_id`` in that order, so request ids follow
    arrivals and are unique across classes.

    Counts: every class gives its ``count``, or ``total`` is given and split among the
    classes with the largest-remainder rule, in proportion to each class's ``share``
    (by default its arrival process's ``rate_per_s``, so that every class spans about
    the same time). A class with ``count`` and a ``total`` do not go together.
    """

    classes: Sequence[RequestClass]
    total: int | None = None
    first_request_id: int = 0
    start_us: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.classes, str | bytes) or not isinstance(self.classes, Sequence):
            raise TypeError(f"classes must be a sequence of RequestClass, got {self.classes!r}")
        classes = tuple(self.classes)
        if not classes:
            raise ValueError("a class mix needs at least one class, got none")
        names: set[str] = set()
        for index, item in enumerate(classes):
            if not isinstance(item, RequestClass):
                raise TypeError(
                    f"classes[{index}] must be a RequestClass, got {type(item).__name__} {item!r}"
                )
            if item.name in names:
                raise ValueError(f"class name {item.name!r} appears twice; names must be unique")
            names.add(item.name)
        _set(self, "classes", classes)
        if self.total is None:
            for item in classes:
                if item.count is None:
                    raise ValueError(
                        f"class {item.name!r} has no count: give every class a count, or "
                        "give the mix a total to split"
                    )
        else:
            _set(self, "total", check_request_count(self.total, "total"))
            for item in classes:
                if item.count is not None:
                    raise ValueError(
                        f"class {item.name!r} has count = {item.count} and the mix has "
                        f"total = {self.total}: give every class a count, or a total with "
                        "shares, not both"
                    )
                if item.share is None and not isinstance(
                    getattr(item.arrivals, "rate_per_s", None), float
                ):
                    raise ValueError(
                        f"class {item.name!r} has no share and its arrival process has no "
                        "rate_per_s to weigh it by: give it a share"
                    )
        made = sum(self.counts())
        if made > MAX_GENERATED_REQUESTS:
            raise ValueError(
                f"the classes make {made:,} requests, more than the limit of "
                f"{MAX_GENERATED_REQUESTS:,} per workload ({_HELD_IN_MEMORY})"
            )
        first = check_count(self.first_request_id, "first_request_id")
        if first + made - 1 > MAX_TIME_US:
            raise OverflowError(
                f"request ids from {first} for {made} requests pass the 64-bit limit"
            )
        _set(self, "first_request_id", first)
        _set(self, "start_us", check_time_us(self.start_us, "start_us"))

    def counts(self) -> list[int]:
        """How many requests each class makes, in class order."""
        if self.total is None:
            return [item.count or 0 for item in self.classes]
        weights = [
            item.share if item.share is not None else float(item.arrivals.rate_per_s)  # type: ignore[attr-defined]
            for item in self.classes
        ]
        return _split_total(self.total, weights)

    @property
    def count(self) -> int:
        """How many requests the mix makes in all."""
        return sum(self.counts())

    def slo_targets(self) -> dict[str, tuple[float | None, float | None]]:
        """``{class name: (ttft_slo_us, tpot_slo_us)}`` for every class with a target."""
        return {
            item.name: item.slo_target
            for item in self.classes
            if item.ttft_slo_us is not None or item.tpot_slo_us is not None
        }

    def generate(self, seed: int) -> GeneratedWorkload:
        """The requests and patience deadlines this mix makes from *seed*.

        Class *c* draws exactly what ``OpenLoopWorkload(c.arrivals, c.prompt_tokens,
        c.output_tokens, count, c.patience, start_us=start_us)`` draws from its own seed,
        a child of ``SeedSequence(seed)`` keyed by ``c.name``: adding, removing or
        reordering other classes does not change a class's arrivals and sizes (only the
        request ids, which follow the merged arrival order).
        """
        seed = check_seed(seed)
        drawn: list[tuple[int, int, int, Request, int | None]] = []
        for order, (item, count) in enumerate(zip(self.classes, self.counts(), strict=True)):
            if count == 0:
                continue  # a share too small to get a request of the total: nothing to draw
            own = OpenLoopWorkload(
                item.arrivals,
                item.prompt_tokens,
                item.output_tokens,
                count,
                patience=item.patience,
                start_us=self.start_us,
            ).generate(_class_seed(seed, item.name))
            patience = {d.request_id: d.time_us for d in own.cancellations}
            for request in own.requests:
                drawn.append(
                    (
                        request.arrival_time_us,
                        order,
                        request.request_id,
                        request,
                        patience.get(request.request_id),
                    )
                )
        drawn.sort(key=lambda row: row[:3])
        requests: list[Request] = []
        deadlines: list[PatienceDeadline] = []
        for position, (arrival, order, _, drawn_request, give_up_us) in enumerate(drawn):
            item = self.classes[order]
            rid = self.first_request_id + position
            deadline = None
            if item.relative_deadline_us is not None:
                deadline = arrival + item.relative_deadline_us
                if deadline > MAX_TIME_US:
                    raise OverflowError(
                        f"request {rid} of class {item.name!r}: deadline {deadline} us is "
                        "past the 64-bit limit 2**63 - 1"
                    )
            requests.append(
                Request(
                    rid,
                    arrival,
                    drawn_request.prompt_token_count,
                    drawn_request.max_output_tokens,
                    request_class=item.name,
                    tenant=item.tenant,
                    priority=item.priority,
                    deadline_us=deadline,
                    tags=item.tags,
                )
            )
            if give_up_us is not None:
                deadlines.append(PatienceDeadline(give_up_us, rid))
        deadlines.sort()
        return GeneratedWorkload(tuple(requests), tuple(deadlines))

    def submit_to(self, engine: WorkloadEngine, seed: int) -> GeneratedWorkload:
        """Generate from *seed*, submit to *engine* (see :meth:`GeneratedWorkload.submit_to`)."""
        generated = self.generate(seed)
        generated.submit_to(engine)
        return generated


# ---------------------------------------------------------------------- closed loop


@dataclass(frozen=True, slots=True)
class ClosedLoopSubmission:
    """One request a closed-loop user submitted, with the random draws that went with it."""

    request_id: int
    user: int
    """The user (0 to ``users - 1``) who submitted it."""
    index: int
    """0 for the user's first request, 1 for the second, ..."""
    submit_time_us: int
    """When it was submitted; also its ``arrival_time_us``."""
    think_time_us: int
    """How long the user thinks after this request ends before submitting the next."""
    patience_us: int | None
    """How long the user waits before cancelling it, or ``None`` for no deadline."""


class ClosedLoopRun:
    """What :meth:`ClosedLoopWorkload.start` set in motion.

    ``processes`` are the users' SimPy processes (in user order); ``submissions`` grows
    as the simulation runs, one :class:`ClosedLoopSubmission` per submitted request in
    submission order.
    """

    __slots__ = ("_processes", "_submissions")

    def __init__(self) -> None:
        self._processes: tuple[simpy.Process, ...] = ()
        self._submissions: list[ClosedLoopSubmission] = []

    @property
    def processes(self) -> tuple[simpy.Process, ...]:
        """One SimPy process per user, in user order."""
        return self._processes

    @property
    def submissions(self) -> tuple[ClosedLoopSubmission, ...]:
        """Every request submitted so far, in submission order."""
        return tuple(self._submissions)


@dataclass(frozen=True, slots=True)
class ClosedLoopWorkload:
    """``users`` clients who each keep exactly one request outstanding at a time.

    Each user, a SimPy process, repeats: submit a request (arrival = now), wait until it
    is terminal (``yield engine.completion(rid)``), think for a drawn time, and ask
    again. It stops after ``requests_per_user`` requests, or (with ``horizon_us``) once
    it would submit at or after that absolute time; requests in flight at the horizon
    still run to the end. Give exactly one of the two.

    With ``patience``, a user who has waited that long for an answer cancels the request
    (if it is not terminal) and goes on thinking, so a request must finish strictly
    before its deadline, as in :meth:`GeneratedWorkload.submit_to`.

    Request ids count up from ``first_request_id`` in submission order, one shared
    counter for all users; the simulation is deterministic, so the ids are too. User
    ``u`` draws from its own child stream of ``SeedSequence(seed)`` (one stream each for
    prompts, outputs, think times and patience), one value per request, so a user's
    n-th request has the same size and think time whatever the server does.

    With ``conversation_block_size_tokens`` (the KV cache's block size), each user is one
    multi-turn conversation: its n-th prompt is its previous prompt, plus the tokens the
    server answered it with, plus the newly drawn prompt tokens (the new message), and it
    names its full blocks, prompt and answer, ``("u<user>", i)`` as ``block_hashes``, so
    a prefix cache can serve the conversation so far, answers included. Sizes then
    depend on what the server answered (a cancelled turn's partial answer), which the
    deterministic simulation makes deterministic too. With ``block_hashes=False`` the
    conversations are the same but their turns name no blocks: the baseline for a
    server without a prefix cache.
    """

    users: int
    think_time_us: LengthDistribution
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    requests_per_user: int | None = None
    horizon_us: int | None = None
    first_request_id: int = 0
    patience: LengthDistribution | None = None
    conversation_block_size_tokens: int | None = None
    """With a block size (the KV cache's), each user is one multi-turn conversation."""
    block_hashes: bool = True
    """Whether a conversation's turns name their full blocks (``False``: the same
    conversations for a server without a prefix cache); only with
    ``conversation_block_size_tokens``."""

    def __post_init__(self) -> None:
        _set(self, "users", check_request_count(self.users, "users"))
        if type(self.block_hashes) is not bool:
            raise TypeError(f"block_hashes must be True or False, got {self.block_hashes!r}")
        if not self.block_hashes and self.conversation_block_size_tokens is None:
            raise ValueError(
                "block_hashes=False is for conversations (it names no blocks of their "
                "turns); without conversation_block_size_tokens no request names any"
            )
        if self.conversation_block_size_tokens is not None:
            _set(
                self,
                "conversation_block_size_tokens",
                check_count(
                    self.conversation_block_size_tokens,
                    "conversation_block_size_tokens",
                    minimum=1,
                ),
            )
        _distribution(self.think_time_us, "think_time_us")
        _distribution(self.prompt_tokens, "prompt_tokens")
        _distribution(self.output_tokens, "output_tokens")
        if self.patience is not None:
            _distribution(self.patience, "patience")
        if (self.requests_per_user is None) == (self.horizon_us is None):
            raise ValueError(
                "give exactly one of requests_per_user and horizon_us, got "
                f"requests_per_user={self.requests_per_user!r}, horizon_us={self.horizon_us!r}"
            )
        if self.requests_per_user is not None:
            per_user = check_count(self.requests_per_user, "requests_per_user", minimum=1)
            if self.users * per_user > MAX_GENERATED_REQUESTS:
                raise ValueError(
                    f"users * requests_per_user = {self.users:,} * {per_user:,} requests, more "
                    f"than the limit of {MAX_GENERATED_REQUESTS:,} per workload ({_HELD_IN_MEMORY})"
                )
            _set(self, "requests_per_user", per_user)
        if self.horizon_us is not None:
            horizon = check_time_us(self.horizon_us, "horizon_us")
            if horizon < 1:
                # As a count of 0 is: a workload that makes no request is a mistake.
                raise ValueError(f"horizon_us must be >= 1, got {horizon}")
            _set(self, "horizon_us", horizon)
        _set(self, "first_request_id", check_count(self.first_request_id, "first_request_id"))

    def start(self, env: Environment, engine: WorkloadEngine, seed: int) -> ClosedLoopRun:
        """Start one process per user on *env* (which must be ``engine.env``).

        Users submit their first requests at ``env.now``, in user order, once the
        simulation runs. Drive it with ``engine.run()`` or ``env.run()``. Returns the
        :class:`ClosedLoopRun` that records the submissions.
        """
        if env is not engine.env:
            raise ValueError("env must be the engine's own environment (engine.env)")
        if self.horizon_us is not None and self.horizon_us <= env.now:
            raise ValueError(
                f"horizon_us {self.horizon_us} is not after the time the users start "
                f"({env.now} us): they would make no request"
            )
        seed = check_seed(seed)
        run = ClosedLoopRun()
        ids = itertools.count(self.first_request_id)
        user_seeds = np.random.SeedSequence(seed).spawn(self.users)
        run._processes = tuple(
            env.process(self._user(env, engine, user, user_seeds[user], ids, run._submissions))
            for user in range(self.users)
        )
        return run

    def _user(
        self,
        env: Environment,
        engine: WorkloadEngine,
        user: int,
        seed: np.random.SeedSequence,
        ids: Iterator[int],
        log: list[ClosedLoopSubmission],
    ) -> Generator[simpy.Event, Any, None]:
        prompt_rng, output_rng, think_rng, patience_rng = (
            np.random.default_rng(child) for child in seed.spawn(4)
        )
        limit = self.requests_per_user
        horizon = self.horizon_us
        block = self.conversation_block_size_tokens
        context = 0  # a conversation's tokens so far: earlier prompts and answers
        index = 0
        while (limit is None or index < limit) and (horizon is None or env.now < horizon):
            request_id = next(ids)
            prompt = int(self.prompt_tokens.sample(prompt_rng, 1)[0])
            output = int(self.output_tokens.sample(output_rng, 1)[0])
            think = int(self.think_time_us.sample(think_rng, 1)[0])
            patience = (
                None if self.patience is None else int(self.patience.sample(patience_rng, 1)[0])
            )
            hashes = None
            if block is not None:
                # The whole conversation is resent with the new message; its full blocks
                # never change once full, so (user, block index) names each one.
                # The answer's blocks are named too: the next turn resends the answer.
                prompt += context
                if self.block_hashes:
                    hashes = tuple((f"u{user}", i) for i in range((prompt + output) // block))
            request = engine.submit(
                Request(request_id, env.now, prompt, output, block_hashes=hashes)
            )
            log.append(ClosedLoopSubmission(request_id, user, index, env.now, think, patience))
            done = engine.completion(request_id)
            if patience is None:
                yield done
            else:
                yield env.any_of([done, env.timeout(patience)])
                if not request.is_terminal:
                    engine.cancel_request(request_id)
            if block is not None:
                context = prompt + request.generated_token_count
            yield env.timeout(think)
            index += 1
