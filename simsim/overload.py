"""Is a run overloaded? Arrivals that outpace completions, and a queue that keeps growing.

A run whose requests arrive faster than the server completes them never reaches a
steady state: its queue grows for as long as requests arrive, and every latency it
reports depends on how long the run lasted. :func:`overload_check` recognises such a
run from its :func:`~simsim.results.requests_frame` alone, so that a summary can say so
instead of printing a latency as if it were steady.

**The rule.** The *window* is the span in which requests arrive: from the first arrival
to the last one (or ``[start_us, end_us)`` when given, a stage of a staged load, say).
The *queue* at an instant is the number of requests that have arrived and wait for a
slot: from their arrival to their (first) admission, or to their end if they were never
admitted; on a disaggregated cluster, also the requests handed over to a decode replica
that wait for admission there. The run is **overloaded** when, over the second half of
the window (the first half is left to the start-up transient: a server that starts
empty fills its batch and its queue before it settles),

1. at least :data:`MIN_ARRIVALS` requests arrived in the window (fewer cannot be
   judged: the answer is not overloaded);
2. the queue grew: the least-squares slope of the queue length, sampled at
   :data:`SAMPLES` evenly spaced instants, times the half's length, is at least
   :data:`GROWTH_SHARE` of the requests that arrived in that half and at least
   :data:`MIN_GROWTH` requests;
3. fewer requests completed in that half than arrived in it.

A stable queue fluctuates around its mean, so its fitted growth is a few requests
whatever the run's length, while an overloaded queue grows by the excess of arrivals
over completions: at a load of 120% of capacity, a sixth of the arrivals. The absolute
floor keeps short runs from being flagged by a burst. What the rule does not see: a
server without any slot or memory limit admits every request at once and never queues;
its overload shows only as latencies that grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from simsim.clock import check_time_us

__all__ = [
    "GROWTH_SHARE",
    "MIN_ARRIVALS",
    "MIN_GROWTH",
    "SAMPLES",
    "OverloadCheck",
    "overload_check",
]

MIN_ARRIVALS = 50
"""The fewest arrivals in the window that :func:`overload_check` judges."""
GROWTH_SHARE = 0.05
"""The queue's growth over the window's second half, as a share of that half's
arrivals, from which a run is overloaded."""
MIN_GROWTH = 15
"""The least growth of the queue, in requests, that can make a run overloaded."""
SAMPLES = 101
"""How many evenly spaced instants of the window's second half the queue is sampled at."""

_MICROSECONDS_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class OverloadCheck:
    """The verdict of :func:`overload_check` and the figures it rests on.

    ``start_us`` and ``end_us`` bound the window (``None`` for a frame with no arrival);
    ``arrivals`` and ``completions`` count the requests that arrived in it and that
    finished in it, and the two rates are those counts per second of the window (NaN for
    an empty one); ``queue_start`` and ``queue_end`` are the queue's length at the
    window's two ends; ``queue_growth`` is the fitted growth of the queue over the
    window's second half (requests), ``growth_threshold`` what it had to reach there.
    ``reason`` says in words why the run is or is not overloaded.
    """

    overloaded: bool
    reason: str
    start_us: int | None
    end_us: int | None
    arrivals: int
    completions: int
    arrival_rate_per_s: float
    completion_rate_per_s: float
    queue_start: int
    queue_end: int
    queue_growth: float
    growth_threshold: float


def overload_check(
    requests: pd.DataFrame, start_us: int | None = None, end_us: int | None = None
) -> OverloadCheck:
    """Judge whether the run of *requests* (a :func:`~simsim.results.requests_frame`,
    a cluster's included) was overloaded over ``[start_us, end_us)``; by default the
    window runs from the first arrival to the last one. See the module's rule."""
    missing = [
        column
        for column in ("state", "arrival_time_us", "admit_time_us", "finish_time_us")
        if column not in requests.columns
    ]
    if missing:
        raise ValueError(f"overload_check needs a requests_frame(); missing columns {missing}")
    arrival = _times(requests["arrival_time_us"])
    if start_us is not None:
        start_us = check_time_us(start_us, "start_us")
    if end_us is not None:
        end_us = check_time_us(end_us, "end_us")
    known = arrival[arrival >= 0]
    start = start_us if start_us is not None else (int(known.min()) if len(known) else None)
    end = end_us if end_us is not None else (int(known.max()) + 1 if len(known) else None)
    if start is None or end is None:
        return _verdict(False, "no request arrived", None, None, 0, 0, 0, 0, 0.0, 0.0)
    if end <= start:
        raise ValueError(f"end_us={end} must be after start_us={start}")
    finished = (requests["state"] == "FINISHED").to_numpy()
    finish = _times(requests["finish_time_us"])
    arrivals = int(np.count_nonzero((arrival >= start) & (arrival < end)))
    completions = int(np.count_nonzero(finished & (finish >= start) & (finish < end)))
    queues = _queues(requests, arrival, finish)
    queue_start, queue_end = (_queue_at(queues, np.array([t]))[0] for t in (start, end - 1))
    middle = start + (end - start) // 2
    half_arrivals = int(np.count_nonzero((arrival >= middle) & (arrival < end)))
    half_completions = int(np.count_nonzero(finished & (finish >= middle) & (finish < end)))
    instants = np.linspace(middle, end - 1, SAMPLES)
    lengths = _queue_at(queues, instants)
    growth = 0.0
    if end - 1 > middle:
        slope = float(np.polyfit(instants - middle, lengths, 1)[0])
        growth = slope * (end - 1 - middle)
    threshold = max(GROWTH_SHARE * half_arrivals, float(MIN_GROWTH))
    counts = (start, end, arrivals, completions, int(queue_start), int(queue_end))
    if arrivals < MIN_ARRIVALS:
        why = f"too few arrivals to judge ({arrivals} < {MIN_ARRIVALS})"
        return _verdict(False, why, *counts, growth, threshold)
    if growth < threshold:
        why = (
            f"the queue grew by {growth:.1f} requests over the second half of the window, "
            f"less than {threshold:.1f}"
        )
        return _verdict(False, why, *counts, growth, threshold)
    if half_completions >= half_arrivals:
        why = (
            f"completions ({half_completions}) kept up with arrivals ({half_arrivals}) over "
            "the second half of the window"
        )
        return _verdict(False, why, *counts, growth, threshold)
    why = (
        f"the queue grew by {growth:.1f} requests (at least {threshold:.1f}) over the second "
        f"half of the window, where {half_arrivals} requests arrived and {half_completions} "
        "completed"
    )
    return _verdict(True, why, *counts, growth, threshold)


def _verdict(
    overloaded: bool,
    reason: str,
    start: int | None,
    end: int | None,
    arrivals: int,
    completions: int,
    queue_start: int,
    queue_end: int,
    growth: float,
    threshold: float,
) -> OverloadCheck:
    seconds = np.nan if start is None or end is None else (end - start) / _MICROSECONDS_PER_S
    return OverloadCheck(
        overloaded=overloaded,
        reason=reason,
        start_us=start,
        end_us=end,
        arrivals=arrivals,
        completions=completions,
        arrival_rate_per_s=arrivals / seconds,
        completion_rate_per_s=completions / seconds,
        queue_start=queue_start,
        queue_end=queue_end,
        queue_growth=float(growth),
        growth_threshold=threshold,
    )


def _times(column: pd.Series) -> npt.NDArray[np.int64]:
    """An ``Int64`` column as int64, a missing time as -1."""
    return np.asarray(column.astype("Int64").fillna(-1).to_numpy(), dtype=np.int64)


_Intervals = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


def _queues(
    requests: pd.DataFrame, arrival: npt.NDArray[np.int64], finish: npt.NDArray[np.int64]
) -> list[_Intervals]:
    """Each queue's ``[begin, end)`` intervals, sorted apart (a missing end: never)."""
    admit = _times(requests["admit_time_us"])
    spans = [(arrival, np.where(admit >= 0, admit, finish))]
    if "decode_replica" in requests.columns:  # a disaggregated cluster's decode queue
        handed = requests["decode_replica"].notna().to_numpy()
        columns = requests.columns
        handoff = _times(
            requests["handoff_time_us" if "handoff_time_us" in columns else "prefill_end_time_us"]
        )
        decode_admit = _times(
            requests[
                "decode_admit_time_us" if "decode_admit_time_us" in columns else "transfer_start_us"
            ]
        )
        spans.append(
            (np.where(handed, handoff, -1), np.where(decode_admit >= 0, decode_admit, finish))
        )
    queues = []
    for begin, end in spans:
        present = begin >= 0
        ends = end[present]
        queues.append((np.sort(begin[present]), np.sort(ends[ends >= 0])))
    return queues


def _queue_at(
    queues: list[_Intervals], instants: npt.NDArray[np.float64] | npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """How many requests wait at each instant: begun at or before it, not yet ended."""
    total = np.zeros(len(instants))
    for begins, ends in queues:
        total += np.searchsorted(begins, instants, side="right")
        total -= np.searchsorted(ends, instants, side="right")
    return total
