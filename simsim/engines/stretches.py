"""Stretches: a run of decode steps that nothing can interrupt, priced at once.

A server whose next steps are all decodes, with nothing else in SimPy's heap before
they end, knows their ends in advance: it schedules one event for the last and writes
the others out when that event comes up, exactly as one event each would have (see
``docs/batching.md``, "Stretches"). This module prices such a run: from a cost model
that can answer for many steps at once (:func:`decode_steps_pricer`), the ends of the
steps up to a horizon (:func:`stretch_ends`). The engines decide when a stretch is
possible and write it out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from simsim.backend import Backend, SimulatedBackend
from simsim.clock import MAX_TIME_US

__all__ = [
    "MAX_STRETCH",
    "MIN_STRETCH",
    "DecodeSteps",
    "decode_steps_pricer",
    "same_steps",
    "stretch_ends",
]

DecodeSteps = Callable[[int, int, npt.NDArray[np.int64]], npt.NDArray[np.int64] | None]
"""Prices a stretch's decode steps: ``(sequences, first cost, context sums) -> costs``
(``None``: price them one by one)."""

MAX_STRETCH = 1 << 16
"""The most steps one stretch covers (a longer run is several stretches)."""

MIN_STRETCH = 4
"""The fewest steps worth a stretch: below it, pricing at once and writing out (a few
NumPy calls, and one pass over the batch) costs more than the steps it saves. Both
costs grow alike with the batch, so the bound does not depend on it (one more step per
8 requests halved the stretches of the largest train.csv experiment, batches of about
120, and made it 10 % slower)."""


def _defining_class(cls: type, name: str) -> type | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def decode_steps_pricer(backend: Backend, iteration_us: object = None) -> DecodeSteps | None:
    """How a stretch of decode steps of *backend* is priced at once, or ``None`` when
    each step must be priced on its own.

    A backend whose ``step_us`` prices every step uses its ``decode_steps_us``
    (:class:`~simsim.backend.DecodeStepsBackend`) if the class that defines ``step_us``
    defines it too (a subclass that changes ``step_us`` alone is priced step by step).
    :class:`~simsim.SimulatedBackend`'s own decode price is the same for every step of a
    fixed batch, unless the server prices iterations with the backend's own
    *iteration_us*. Any other backend is asked once per step, as it may count its calls.
    """
    cls = type(backend)
    if hasattr(cls, "step_us"):
        owner = _defining_class(cls, "step_us")
        steps = getattr(backend, "decode_steps_us", None)
        if owner is None or owner is not _defining_class(cls, "decode_steps_us"):
            return None
        if not callable(steps):
            return None
        return lambda count, first, sums: steps(count, sums)
    if (
        iteration_us is None
        and isinstance(backend, SimulatedBackend)
        and _defining_class(cls, "decode_step_us") is SimulatedBackend
    ):
        return same_steps
    return None


def same_steps(count: int, first: int, sums: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Every decode step of a fixed batch costs what the first did."""
    return np.full(len(sums), first, dtype=np.int64)


def stretch_ends(
    pricer: DecodeSteps,
    count: int,
    first_end: int,
    first_cost: int,
    contexts: int,
    limit: int,
    horizon: int | None,
) -> npt.NDArray[np.int64] | None:
    """The ends of up to *limit* decode steps of *count* sequences, the first ending at
    *first_end* after costing *first_cost*, its contexts summing to *contexts* (each
    later step's sum is *count* more): enough of them to reach *horizon* (all *limit*
    when it is ``None``). ``None`` when the cost model cannot price them at once or an
    end could pass ``2**63 - 1`` (step by step then raises where it belongs)."""
    if pricer is same_steps:  # an arithmetic series: sized at once
        size = limit
        if horizon is not None and first_cost:
            size = min(size, (horizon - first_end - 1) // first_cost + 1)
        if first_cost * (size - 1) > MAX_TIME_US - first_end:
            return None
        return first_end + first_cost * np.arange(size, dtype=np.int64)
    size = min(limit, 16)
    while True:
        steps = np.arange(1, size, dtype=np.int64)
        costs = pricer(count, first_cost, contexts + count * steps)
        if costs is None:
            return None
        if len(costs) and int(costs.max()) * len(costs) > MAX_TIME_US - first_end:
            return None
        ends = np.empty(size, dtype=np.int64)
        ends[0] = first_end
        np.cumsum(costs, out=ends[1:])
        ends[1:] += first_end
        if size >= limit or (horizon is not None and ends[-1] >= horizon):
            return ends
        size = min(limit, size * 4)
