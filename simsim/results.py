"""Results as pandas DataFrames: requests, events, admissions, and a summary.

These functions read what an engine recorded and never change it. Every timestamp and
integer duration column has pandas' nullable ``Int64`` dtype, so a time that never
happened is ``<NA>``, never a sentinel number. ``tpot_us`` is a nullable ``Float64``.

Derived latency columns (all in microseconds, from the request's own timestamps):

- ``queue_delay_us`` = admit - arrival (admitted requests);
- ``ttft_us`` = first token - arrival (requests that produced a token);
- ``e2e_latency_us`` = finish - arrival (``FINISHED`` requests only);
- ``tpot_us`` = (finish - first token) / (tokens - 1) (``FINISHED`` with 2+ tokens).

A cluster's frame (:meth:`simsim.Cluster.requests_frame`) also names each request's
replica; :func:`summarize` then adds load-balance rows and :func:`replica_summary`
gives one row per replica (``docs/cluster.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from simsim.admission import REJECTION_REASONS
from simsim.checks import check_positive_int, check_real, check_weight
from simsim.clock import check_count, check_time_us
from simsim.overload import overload_check
from simsim.records import ITERATION_COLUMNS, AdmissionLog, EventLog, EventType, IterationLog
from simsim.request import METADATA_COLUMNS as METADATA_COLUMN_DTYPES
from simsim.request import Request, RequestState

__all__ = [
    "CLASS_KEYS",
    "CLIENT_COLUMNS",
    "DEFAULT_PERCENTILES",
    "NO_CLASS",
    "OVERLOAD_METRICS",
    "REPLICA_LOAD_WINDOWS",
    "REQUEST_COLUMNS",
    "TOKEN_COLUMNS",
    "RecordedServer",
    "admissions_frame",
    "batch_summary",
    "class_summary",
    "events_frame",
    "iterations_frame",
    "latency_counts",
    "occupancy_series",
    "percentile_label",
    "prefix_cache_summary",
    "replica_load_series",
    "replica_pools",
    "replica_requests",
    "replica_summary",
    "requests_frame",
    "run_summary",
    "run_tables",
    "server_kv_blocks",
    "server_replicas",
    "server_slots",
    "summarize",
    "time_weighted_means",
    "token_rates",
    "transfer_summary",
]

_TIMESTAMP_FIELDS = (
    "arrival_time_us",
    "admit_time_us",
    "prefill_end_time_us",
    "first_token_time_us",
    "finish_time_us",
)

REQUEST_COLUMNS = (
    "request_id",
    "state",
    "arrival_time_us",
    "prompt_token_count",
    "max_output_tokens",
    "generated_token_count",
    "admit_time_us",
    "prefill_end_time_us",
    "first_token_time_us",
    "finish_time_us",
    "queue_delay_us",
    "ttft_us",
    "e2e_latency_us",
    "tpot_us",
)
"""The columns of :func:`requests_frame`, in order."""

TOKEN_COLUMNS: Final = ("request_id", "token_index", "time_us")
"""The columns of a measured run's ``tokens`` table (``simsim replay``): one row per
token received, ``token_index`` counting from 1 and ``time_us`` when it arrived."""

_FINISHED = RequestState.FINISHED
_LATENCY_COLUMNS = ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us")
_DECODE_QUEUE_DELAY = "decode_queue_delay_us"
"""The column of a disaggregated cluster's frame that holds each request's wait for
admission on its decode replica (decode admission - hand-off); :func:`summarize` gives
its statistics after ``queue_delay_us``'s."""
CLIENT_COLUMNS: Final = ("client_ttft_us", "client_e2e_us")
"""Latencies as a client sees them, beyond the engine's: the columns
:meth:`simsim.scenario.Scenario.requests_frame` appends for a vLLM server (its frontend's
overheads added). :func:`summarize` reports the statistics of those a frame has."""
OVERLOAD_METRICS: Final = (
    "overloaded",
    "arrival_rate_requests_per_s",
    "completion_rate_requests_per_s",
    "queue_growth",
)
"""The rows :func:`run_summary` appends from :func:`simsim.overload.overload_check`."""
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
"""The percentiles :func:`summarize` reports unless told otherwise."""


def requests_frame(requests: Mapping[int, Request] | Iterable[Request]) -> pd.DataFrame:
    """One row per request, in request id order, with timestamps and derived latencies."""
    items = requests.values() if isinstance(requests, Mapping) else requests
    rows = sorted(items, key=lambda r: r.request_id)
    data: dict[str, Any] = {
        "request_id": pd.array([r.request_id for r in rows], dtype="int64"),
        "state": pd.array([r.state.name for r in rows], dtype="str"),
        "prompt_token_count": pd.array([r.prompt_token_count for r in rows], dtype="int64"),
        "max_output_tokens": pd.array([r.max_output_tokens for r in rows], dtype="int64"),
        "generated_token_count": pd.array([r.generated_token_count for r in rows], dtype="int64"),
    }
    for name in _TIMESTAMP_FIELDS:
        data[name] = pd.Series([getattr(r, name) for r in rows], dtype="Int64")
    arrival = data["arrival_time_us"]
    finished = np.fromiter((r.state is _FINISHED for r in rows), dtype=bool, count=len(rows))
    tokens = np.fromiter((r.generated_token_count for r in rows), dtype=np.int64, count=len(rows))
    data["queue_delay_us"] = data["admit_time_us"] - arrival
    data["ttft_us"] = data["first_token_time_us"] - arrival
    data["e2e_latency_us"] = (data["finish_time_us"] - arrival).where(finished, pd.NA)
    has_tpot = finished & (tokens >= 2)
    decode_span = (data["finish_time_us"] - data["first_token_time_us"]).astype("Float64")
    steps = pd.Series(np.where(has_tpot, tokens - 1, 1), dtype="Float64")
    data["tpot_us"] = (decode_span / steps).where(has_tpot, pd.NA)
    frame = pd.DataFrame({name: data[name] for name in REQUEST_COLUMNS})
    if any(r.has_metadata for r in rows):
        _append_metadata(frame, rows)
    return frame


METADATA_COLUMNS = tuple(METADATA_COLUMN_DTYPES)
"""The columns :func:`requests_frame` appends when any request carries metadata, then
one ``tag_<key>`` column per tag key (in first-seen order)."""


def _append_metadata(frame: pd.DataFrame, rows: Sequence[Request]) -> None:
    for column, dtype in METADATA_COLUMN_DTYPES.items():
        frame[column] = pd.array([getattr(r, column) for r in rows], dtype=dtype)
    keys: dict[str, None] = {}
    for request in rows:
        if request.tags:
            keys.update(dict.fromkeys(request.tags))
    for key in keys:
        frame[f"tag_{key}"] = pd.Series(
            [None if not r.tags else r.tags.get(key) for r in rows], dtype="object"
        )


def events_frame(log: EventLog) -> pd.DataFrame:
    """One row per logged event: ``timestamp_us, sequence, event_type, request_id``."""
    names = [member.name for member in EventType]
    timestamps, sequences, types, request_ids = log.columns
    return pd.DataFrame(
        {
            "timestamp_us": pd.array(timestamps, dtype="Int64"),
            "sequence": pd.array(sequences, dtype="int64"),
            "event_type": pd.array([names[k] for k in types], dtype="str"),
            "request_id": pd.array(request_ids, dtype="int64"),
        }
    )


def iterations_frame(records: Sequence[Any] | IterationLog) -> pd.DataFrame:
    """One row per batching iteration (see :class:`simsim.IterationRecord`).

    ``start_us`` and ``end_us`` are ``Int64``; an engine with no iterations gives an
    empty frame with the same columns.
    """
    columns: dict[str, Any] = {}
    for name in ITERATION_COLUMNS:
        if isinstance(records, IterationLog):
            values: Any = np.frombuffer(records.column(name), dtype=_COLUMN_DTYPES[name])
        else:
            values = [getattr(record, name) for record in records]
        dtype = "bool" if name == "abandoned" else ("Int64" if name.endswith("_us") else "int64")
        columns[name] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(columns)


_COLUMN_DTYPES = {name: "int8" if name == "abandoned" else "int64" for name in ITERATION_COLUMNS}


def admissions_frame(log: AdmissionLog) -> pd.DataFrame:
    """One row per admission: ``timestamp_us, request_id, epoch``."""
    return pd.DataFrame(
        {
            "timestamp_us": pd.array(log.timestamps, dtype="Int64"),
            "request_id": pd.array(log.request_ids, dtype="int64"),
            "epoch": pd.array(log.epochs, dtype="int64"),
        }
    )


def summarize(
    requests: pd.DataFrame,
    *,
    ttft_slo_us: float | None = None,
    tpot_slo_us: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slots: int | tuple[int, int] | None = None,
    warmup_us: int | None = None,
    until_us: int | None = None,
    replicas: int | tuple[int, int] | None = None,
    by: str | None = None,
) -> pd.DataFrame:
    """Summarise a :func:`requests_frame`: one row per metric, in a ``value`` column.

    Rows: ``requests`` and ``count_<STATE>`` for every state (a frame with
    ``rejection``, from a server with an admission control, then adds
    ``count_rejected``, ``count_rejected_rate_limited``, ``count_rejected_queue_full``
    and ``rejected_share``; rejected requests are ``CANCELLED`` too); ``makespan_us`` (first
    arrival to last finish); ``throughput_requests_per_s`` and
    ``throughput_tokens_per_s`` (finished requests and generated tokens per simulated
    second of makespan); then ``<column>_mean``, ``_p50``, ``_p90`` and ``_p99`` for
    ``queue_delay_us``, ``ttft_us``, ``e2e_latency_us`` and ``tpot_us`` (and, in a frame
    that has them, :data:`CLIENT_COLUMNS`: a vLLM server's latencies as its clients see
    them) over the rows where the value exists. Percentiles use linear interpolation
    (pandas' default); *percentiles* (numbers strictly between 0 and 100) chooses others,
    each named by
    :func:`percentile_label` (``99.9`` gives ``ttft_us_p99.9``).

    With ``ttft_slo_us`` and/or ``tpot_slo_us``, also ``slo_attainment`` (the fraction
    of all requests that finished and met every given target; a request with no
    ``tpot_us`` meets a TPOT target) and ``goodput_requests_per_s`` (those requests
    per simulated second of makespan). Missing values (no finished request, say) are
    ``NaN``.

    **Measurement window.** ``warmup_us`` and ``until_us`` (int microseconds, either or
    both) restrict the summary to the window ``[warmup_us, until_us)``, so that the
    start-up transient can be left out. The window starts at ``warmup_us`` (default:
    the first arrival) and ends at ``until_us`` (default: the last finish); every
    per-request metric (counts, latencies, throughput, SLO rows) then covers only the
    requests that *arrived* in the window (``warmup_us <= arrival_time_us <
    until_us``; a bound not given does not filter), each counted whole even if it
    finishes after ``until_us``; ``makespan_us`` is the window's length, and
    throughputs are per second of it. Without either argument, the window is first
    arrival to last finish and every number is as without a window.

    **Occupancy** (with ``slots``, the server's slot count: ``1`` for the single-slot
    engines, ``max_active_requests`` for the batching engine) adds three rows, time
    averages over the window in which every request counts for the part of its
    interval inside the window, whether it arrived in the window or not:

    - ``mean_queue_length``: the number of requests queued (arrived, not yet admitted,
      not cancelled): each request's ``[arrival, admit)`` interval, or
      ``[arrival, finish)`` if it was cancelled while queued;
    - ``mean_active_requests``: the number holding a slot, each request's
      ``[admit, finish)`` interval (finished or cancelled);
    - ``utilization``: ``mean_active_requests / slots``, the busy fraction per slot.

    An interval still open (a frame taken before the run ended) is cut at the window's
    end. The frame holds only a request's first admission: a request preempted by the
    batching engine counts as holding its slot from its first admission to its finish,
    also while it waited to be readmitted, so with preemptions ``utilization`` is an
    upper bound and ``mean_queue_length`` a lower bound.

    A disaggregated cluster's frame (``prefill_replica`` and ``decode_replica``) takes
    *slots* as a pair, the prefill pool's and the decode pool's slot counts (one int is
    refused: it cannot say how the slots split). A request queues for a prefill slot
    over ``[arrival, admit)``, holds it over ``[admit, hand-off)`` (to its end if it
    never left), queues for a decode slot over ``[hand-off, decode admission)`` and
    holds that over ``[decode admission, end)``; the three rows then cover both pools
    (``utilization`` over the sum of the slots), and the same three rows follow per
    pool, named with ``prefill_`` and ``decode_`` in front. A frame with
    ``decode_queue_delay_us`` (decode admission - hand-off) also gets that column's
    mean and percentiles, after ``queue_delay_us``'s.

    **Prefix cache** (a frame with ``cached_prompt_tokens``, from a batching server with
    a prefix cache) adds ``prefix_cache_hit_rate_tokens`` (prompt tokens served from the
    cache over all prompt tokens) and ``prefix_cache_hit_rate_requests`` (the fraction
    of requests that were served any), over the window's requests.

    **Load balance** (a cluster's frame: a ``replica`` column, or ``prefill_replica``
    and ``decode_replica`` for disaggregated prefill and decode) adds, last, the rows
    ``replicas`` (how many), ``replica_requests_min`` and ``_max`` (requests routed to
    a replica, among the window's requests), ``replica_load_imbalance`` (the maximum
    over the mean of those counts: 1 is perfect balance), and
    ``replica_utilization_min``, ``_mean``, ``_max`` and ``_spread`` (max - min), where
    a replica's utilisation is the fraction of the window in which it held at least one
    request (see :func:`replica_summary`). A disaggregated frame gets these rows once
    per pool, named with ``prefill_`` and ``decode_`` in front (``prefill_replicas``,
    ``decode_replica_utilization_spread``...). *replicas* says how many replicas there
    are (for a disaggregated frame, a pair: prefill count, decode count), so that a
    replica that received no request counts; by default the highest replica index in
    the frame decides. A frame without these columns gets none of these rows and
    *replicas* must be ``None``.

    **Per class** (``by="request_class"``, ``"class"`` or ``"tenant"``): the same rows
    per request class or per tenant, one column per class instead of ``value``, with
    the fairness rows for tenants; ``ttft_slo_us`` and ``tpot_slo_us`` then apply to
    every class. This is :func:`class_summary`, which also takes targets per class;
    *slots* and *replicas* must be ``None``.
    """
    if by is not None:
        if slots is not None or replicas is not None:
            raise ValueError(
                f"summarize(by={by!r}) gives per-class rows only: slots ({slots!r}) and "
                f"replicas ({replicas!r}) must be None; call summarize without by for them"
            )
        targets = {"ttft_us": ttft_slo_us, "tpot_us": tpot_slo_us}
        return class_summary(
            requests,
            by,
            slo=None if ttft_slo_us is None and tpot_slo_us is None else {"*": targets},
            percentiles=percentiles,
            warmup_us=warmup_us,
            until_us=until_us,
        )
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"summarize needs a requests_frame(); missing columns {missing}")
    labels = [(percentile_label(q), q / 100.0) for q in _check_percentiles(percentiles)]
    if ttft_slo_us is not None:
        ttft_slo_us = _non_negative_real(ttft_slo_us, "ttft_slo_us")
    if tpot_slo_us is not None:
        tpot_slo_us = _non_negative_real(tpot_slo_us, "tpot_slo_us")
    pools = _replica_pools(requests, replicas, required=False)
    slot_counts = None if slots is None else _slot_counts(slots, pools)
    start_us, end_us, selected = _window(requests, warmup_us, until_us)
    metrics = _request_metrics(selected, start_us, end_us, labels, ttft_slo_us, tpot_slo_us)
    if slot_counts is not None:
        metrics.update(_occupancy(requests, start_us, end_us, slot_counts, pools))
    if "cached_prompt_tokens" in selected.columns:
        cache = prefix_cache_summary(selected)
        metrics["prefix_cache_hit_rate_tokens"] = float(cache["hit_rate_tokens"])
        metrics["prefix_cache_hit_rate_requests"] = float(cache["hit_rate_requests"])
    if pools:
        metrics.update(_balance(requests, selected, start_us, end_us, pools))
    frame = pd.DataFrame({"value": pd.Series(metrics, dtype="float64")})
    frame.index.name = "metric"
    return frame


def _request_metrics(
    selected: pd.DataFrame,
    start_us: int | None,
    end_us: int | None,
    labels: Sequence[tuple[str, float]],
    ttft_slo_us: float | None,
    tpot_slo_us: float | None,
) -> dict[str, float]:
    """:func:`summarize`'s rows from ``requests`` to ``goodput_requests_per_s`` for the
    *selected* requests, throughputs per second of the window ``[start_us, end_us)``."""
    metrics: dict[str, float] = {"requests": float(len(selected))}
    states = selected["state"].astype(str)
    for state in RequestState:
        metrics[f"count_{state.name}"] = float((states == state.name).sum())
    if "rejection" in selected.columns:
        rejections = selected["rejection"]
        metrics["count_rejected"] = float(rejections.notna().sum())
        for reason in REJECTION_REASONS:
            metrics[f"count_rejected_{reason}"] = float((rejections == reason).sum())
        total = len(selected)
        metrics["rejected_share"] = metrics["count_rejected"] / total if total else math.nan
    finished = states == RequestState.FINISHED.name
    # In ints, as before windows existed: a float difference could round differently.
    makespan = math.nan if start_us is None or end_us is None else float(end_us - start_us)
    metrics["makespan_us"] = makespan
    seconds = makespan / 1e6 if makespan and makespan > 0 else math.nan
    metrics["throughput_requests_per_s"] = float(finished.sum()) / seconds
    metrics["throughput_tokens_per_s"] = float(selected["generated_token_count"].sum()) / seconds
    latencies: tuple[str, ...] = _LATENCY_COLUMNS
    if _DECODE_QUEUE_DELAY in selected.columns:  # a disaggregated cluster's second queue
        latencies = (latencies[0], _DECODE_QUEUE_DELAY, *latencies[1:])
    latencies += tuple(column for column in CLIENT_COLUMNS if column in selected.columns)
    for column in latencies:
        values = selected[column].dropna().astype("float64")
        metrics[f"{column}_mean"] = float(values.mean()) if len(values) else math.nan
        for label, q in labels:
            metrics[f"{column}_{label}"] = float(values.quantile(q)) if len(values) else math.nan
    if ttft_slo_us is not None or tpot_slo_us is not None:
        good = finished.to_numpy(dtype=bool, copy=True)
        if ttft_slo_us is not None:
            ttft = selected["ttft_us"].astype("Float64")
            # A zero-output request has no first token: TTFT counts as its e2e latency.
            ttft = ttft.fillna(selected["e2e_latency_us"].astype("Float64"))
            good &= (ttft <= ttft_slo_us).fillna(False).to_numpy(dtype=bool)
        if tpot_slo_us is not None:
            tpot = selected["tpot_us"].astype("Float64")
            good &= (tpot <= tpot_slo_us).fillna(True).to_numpy(dtype=bool)
        total = len(selected)
        metrics["slo_attainment"] = float(good.sum()) / total if total else math.nan
        metrics["goodput_requests_per_s"] = float(good.sum()) / seconds
    return metrics


def latency_counts(requests: pd.DataFrame) -> pd.Series:
    """How many requests of a :func:`requests_frame` have each latency, the rows its
    :func:`summarize` statistics cover: ``queue_delay_us`` (admitted requests),
    ``ttft_us`` (requests that produced a token), ``e2e_latency_us`` (finished
    requests), ``tpot_us`` (finished requests with 2+ tokens) and, in a disaggregated
    cluster's frame, ``decode_queue_delay_us`` (requests admitted on a decode
    replica). ``int64``, indexed by column."""
    columns = [
        *_LATENCY_COLUMNS,
        *([_DECODE_QUEUE_DELAY] if _DECODE_QUEUE_DELAY in requests else []),
    ]
    counts = {column: int(requests[column].notna().sum()) for column in columns}
    return pd.Series(counts, dtype="int64")


def percentile_label(percentile: float) -> str:
    """The suffix :func:`summarize` uses for a percentile: ``99`` -> ``"p99"``.

    Written as Python writes the float, without a trailing ``.0``: ``99.9`` -> ``"p99.9"``.
    """
    text = repr(float(percentile))
    return f"p{text.removesuffix('.0')}"


def _check_percentiles(percentiles: Sequence[float]) -> list[float]:
    checked = []
    for value in percentiles:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 100:
            raise ValueError(
                f"percentiles must be numbers strictly between 0 and 100, got {value!r}"
            )
        checked.append(float(value))
    if len({percentile_label(q) for q in checked}) != len(checked):
        raise ValueError(f"percentiles must not repeat, got {list(percentiles)!r}")
    return checked


def _window(
    requests: pd.DataFrame, warmup_us: int | None, until_us: int | None
) -> tuple[int | None, int | None, pd.DataFrame]:
    """The window's start and end (``None`` when unknown) and the requests it selects."""
    warmup = None if warmup_us is None else check_time_us(warmup_us, "warmup_us")
    until = None if until_us is None else check_time_us(until_us, "until_us")
    if warmup is not None and until is not None and until <= warmup:
        raise ValueError(
            f"the measurement window must not be empty: until_us ({until}) must be "
            f"greater than warmup_us ({warmup})"
        )
    arrival = requests["arrival_time_us"]
    start = warmup if warmup is not None else _int_or_none(arrival.min())
    end = until if until is not None else _int_or_none(requests["finish_time_us"].max())
    if warmup is not None and until is None and end is not None and end <= warmup:
        raise ValueError(
            f"the measurement window is empty: warmup_us ({warmup}) is at or after the "
            f"last finish ({end} us); give a smaller warmup_us"
        )
    if warmup is None and until is None:
        return start, end, requests
    keep = pd.Series(True, index=requests.index)
    if warmup is not None:
        keep &= arrival >= warmup
    if until is not None:
        keep &= arrival < until
    return start, end, requests[keep.to_numpy(dtype=bool)]


def _non_negative_real(value: object, name: str) -> float:
    return check_real(value, name, unit=" microseconds")


def _int_or_none(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def _slot_counts(slots: object, pools: Sequence[_Pool]) -> tuple[int, ...]:
    """*slots* checked against the frame: one count for a server or a cluster, a pair
    (prefill slots, decode slots) for a disaggregated cluster's two pools."""
    if len(pools) != 2:
        if isinstance(slots, tuple | list):
            raise TypeError(
                f"slots must be an int (the server's or the cluster's slot count), got "
                f"{slots!r}; a pair is for a disaggregated cluster's frame, and this one "
                f"has no {_PREFILL_COLUMN!r} and {_DECODE_COLUMN!r} columns"
            )
        return (check_count(slots, "slots", minimum=1),)
    if not isinstance(slots, tuple | list) or len(slots) != 2:
        raise TypeError(
            f"slots must be a pair (prefill slots, decode slots) for a disaggregated "
            f"cluster's requests frame, got {slots!r}: its pools hold requests at "
            "different times, so each needs its own count (the sum of max_active_requests "
            "over the pool's replicas)"
        )
    return tuple(
        check_count(count, f"slots[{position}] ({pool.name} slots)", minimum=1)
        for position, (count, pool) in enumerate(zip(slots, pools, strict=True))
    )


def _occupancy(
    requests: pd.DataFrame,
    start: int | None,
    end: int | None,
    slots: tuple[int, ...],
    pools: Sequence[_Pool],
) -> dict[str, float]:
    """Time averages over ``[start, end)`` of the queued and slot-holding counts: for the
    whole server or cluster, then, for a disaggregated frame, per pool."""
    stages = list(zip(_occupancy_pools(pools), slots, strict=True))
    rows: list[tuple[str, float, float, int]] = []  # (prefix, queued, active, slots)
    if start is None or end is None or end <= start:  # an empty frame, or nothing finished
        rows = [(pool.prefix, math.nan, math.nan, count) for pool, count in stages]
    else:
        for pool, count in stages:
            queued = _time_average(*pool.queued(requests), start, end)
            active = _time_average(*pool.hold(requests), start, end)
            rows.append((pool.prefix, queued, active, count))
    if len(rows) > 1:  # the whole cluster first: every slot of both pools
        total = (
            "",
            sum(row[1] for row in rows),
            sum(row[2] for row in rows),
            sum(row[3] for row in rows),
        )
        rows.insert(0, total)
    metrics: dict[str, float] = {}
    for prefix, queued, active, count in rows:
        metrics[f"{prefix}mean_queue_length"] = queued
        metrics[f"{prefix}mean_active_requests"] = active
        metrics[f"{prefix}utilization"] = active / count
    return metrics


def _time_average(begin: pd.Series, end: pd.Series, start: int, window_end: int) -> float:
    """The time average over ``[start, window_end)`` of how many of the intervals
    ``[begin, end)`` hold (a missing begin: no interval; a missing end: still open)."""
    # Times relative to the window's start, taken in ints: exact before going to floats.
    length = float(window_end - start)
    # A missing begin becomes the window's end: an empty interval, summed as before.
    return _overlap(_relative(begin, start, length), _relative(end, start, length), length) / length


def _relative(column: pd.Series, start: int, missing: float) -> np.ndarray:
    """``column - start`` as floats, with *missing* where the time is ``<NA>``."""
    shifted = column.astype("Int64") - start
    return shifted.astype("Float64").to_numpy(dtype="float64", na_value=missing)


def _overlap(begin: np.ndarray, end: np.ndarray, length: float) -> float:
    """Total length of the intervals ``[begin, end)`` inside ``[0, length)``."""
    lengths = np.minimum(end, length) - np.maximum(begin, 0.0)
    return float(np.clip(lengths, 0.0, None).sum())


# ---------------------------------------------------------------------- clusters

_REPLICA_COLUMN = "replica"
_PREFILL_COLUMN = "prefill_replica"
_DECODE_COLUMN = "decode_replica"


class _Pool:
    """Replicas whose requests a frame names in one column, and how each holds them.

    ``name`` is ``""`` for a cluster's replicas, ``"prefill"`` or ``"decode"`` for a
    disaggregated cluster's pools; ``indices`` are the replicas' indices in the cluster.
    """

    __slots__ = ("column", "indices", "name")

    def __init__(self, name: str, column: str, indices: range) -> None:
        self.name = name
        self.column = column
        self.indices = indices

    @property
    def prefix(self) -> str:
        """What the pool's rows of :func:`summarize` start with: ``""``, ``"prefill_"``
        or ``"decode_"``."""
        return f"{self.name}_" if self.name else ""

    def queued(self, requests: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """Each request's ``[begin, end)`` queued for a slot in this pool: from its
        routing there (its arrival; for a decode replica, its hand-off) to its admission
        there or, never admitted, its end (a missing begin: it never queued here; a
        missing end: it still does)."""
        finish = requests["finish_time_us"].astype("Int64")
        if self.name == "decode":
            handed = requests[_DECODE_COLUMN].notna()
            begin = self._handoff(requests).where(handed, pd.NA)
            return begin, _decode_admission(requests).fillna(finish)
        admit = requests["admit_time_us"].astype("Int64")
        return requests["arrival_time_us"].astype("Int64"), admit.fillna(finish)

    def hold(self, requests: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """Each request's ``[begin, end)`` holding a place on its replica in this pool
        (``Int64``; a missing begin: it never held one there; a missing end: it still
        does)."""
        finish = requests["finish_time_us"].astype("Int64")
        if self.name == "prefill":
            return requests["admit_time_us"].astype("Int64"), self._left(requests, finish)
        if self.name == "decode":
            # Admission on the decode replica reserves its blocks and starts the transfer.
            return _decode_admission(requests), finish
        return requests["admit_time_us"].astype("Int64"), finish

    def outstanding(self, requests: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """Each request's ``[begin, end)`` on its replica in this pool, queued or held:
        from its routing there (its arrival; for a decode replica, its hand-off) to its
        end or hand-off (a missing end: it is still there)."""
        finish = requests["finish_time_us"].astype("Int64")
        arrival = requests["arrival_time_us"].astype("Int64")
        if self.name == "prefill":
            return arrival, self._left(requests, finish)
        if self.name == "decode":
            handed = requests[_DECODE_COLUMN].notna()
            return self._handoff(requests).where(handed, pd.NA), finish
        return arrival, finish

    @staticmethod
    def _handoff(requests: pd.DataFrame) -> pd.Series:
        if "handoff_time_us" in requests.columns:
            return requests["handoff_time_us"].astype("Int64")
        handoff = requests["prefill_end_time_us"].astype("Int64")
        # A recompute after a preemption on the decode replica moves prefill_end later;
        # the transfer starts after the hand-off: the earlier of the two is the nearer.
        start = requests["transfer_start_us"].astype("Int64")
        return handoff.where((handoff <= start).fillna(True), start)

    def _left(self, requests: pd.DataFrame, finish: pd.Series) -> pd.Series:
        """When a request left its prefill replica: the hand-off, or its end if it
        never left (cancelled there, or a zero-output request finished there)."""
        handed = requests[_DECODE_COLUMN].notna()
        return finish.where(~handed, self._handoff(requests))


_ONE_POOL = _Pool("", _REPLICA_COLUMN, range(0))
"""A server's slots, or a plain cluster's taken together: the intervals of
:func:`summarize`'s occupancy rows for a frame without prefill and decode pools."""


def _occupancy_pools(pools: Sequence[_Pool]) -> Sequence[_Pool]:
    """Whose slots occupancy counts, from a frame's *pools* (:func:`_replica_pools`): a
    disaggregated cluster's two pools apart, or every slot of the frame as one."""
    return pools if len(pools) == 2 else (_ONE_POOL,)


def _decode_admission(requests: pd.DataFrame) -> pd.Series:
    """When each request was first admitted on its decode replica (the start of its
    transfer; a frame written before ``decode_admit_time_us`` existed: the start of the
    transfer that completed)."""
    column = "decode_admit_time_us"
    return requests[column if column in requests.columns else "transfer_start_us"].astype("Int64")


def _replica_pools(requests: pd.DataFrame, replicas: object, *, required: bool) -> list[_Pool]:
    """The frame's pools (none for a frame without replica columns), checked."""
    columns = requests.columns
    if _PREFILL_COLUMN in columns or _DECODE_COLUMN in columns:
        lacking = [
            c for c in (_PREFILL_COLUMN, _DECODE_COLUMN, "transfer_start_us") if c not in columns
        ]
        if lacking:
            raise ValueError(
                f"a disaggregated requests frame has {_PREFILL_COLUMN!r}, {_DECODE_COLUMN!r} "
                f"and 'transfer_start_us'; this one lacks {lacking}"
            )
        prefill = _indices(requests[_PREFILL_COLUMN], _PREFILL_COLUMN)
        decode = _indices(requests[_DECODE_COLUMN], _DECODE_COLUMN)
        if replicas is None:
            prefill_count = int(decode.min()) if len(decode) else _count_of(prefill)
            decode_count = int(decode.max()) + 1 - prefill_count if len(decode) else 0
        elif (
            isinstance(replicas, tuple | list)
            and len(replicas) == 2
            and all(type(n) is int and n >= 1 for n in replicas)
        ):
            prefill_count, decode_count = replicas
        else:
            raise ValueError(
                f"replicas must be a pair of ints >= 1 (prefill count, decode count) for "
                f"a disaggregated requests frame, got {replicas!r}"
            )
        pools = [
            _Pool("prefill", _PREFILL_COLUMN, range(prefill_count)),
            _Pool("decode", _DECODE_COLUMN, range(prefill_count, prefill_count + decode_count)),
        ]
    elif _REPLICA_COLUMN in columns:
        seen = _indices(requests[_REPLICA_COLUMN], _REPLICA_COLUMN)
        if replicas is None:
            count = _count_of(seen)
        elif type(replicas) is int and replicas >= 1:
            count = replicas
        else:
            raise ValueError(
                f"replicas must be an int >= 1 (the cluster's replica count), got {replicas!r}"
            )
        pools = [_Pool("", _REPLICA_COLUMN, range(count))]
    elif replicas is not None or required:
        raise ValueError(
            f"the requests frame has no replica column ({_REPLICA_COLUMN!r}, or "
            f"{_PREFILL_COLUMN!r} and {_DECODE_COLUMN!r}): it is not a cluster's "
            "requests_frame()"
            + ("" if replicas is None else f", so replicas={replicas!r} does not apply")
        )
    else:
        return []
    for pool in pools:
        seen = _indices(requests[pool.column], pool.column)
        outside = sorted({int(i) for i in seen if int(i) not in pool.indices})
        if outside:
            raise ValueError(
                f"{pool.column} holds {outside}, outside the replicas "
                f"{pool.indices.start}..{pool.indices.stop - 1} that replicas={replicas!r} "
                "gives; pass the cluster's replica counts"
            )
    return pools


def replica_pools(
    requests: pd.DataFrame, *, required: bool = False
) -> tuple[tuple[str, range], ...]:
    """A cluster's pools of replicas, as its requests frame names them: ``()`` for a
    frame without replica columns (one server's), one ``("", indices)`` for a cluster's
    (``replica``), ``("prefill", ...)`` then ``("decode", ...)`` for a disaggregated
    cluster's (``prefill_replica`` and ``decode_replica``). The indices run from 0 to
    the highest replica the frame names (the decode pool's follow the prefill pool's).
    *required*: a frame without replica columns is refused (``ValueError``).
    """
    pools = _replica_pools(requests, None, required=required)
    return tuple((pool.name, pool.indices) for pool in pools)


def _indices(column: pd.Series, name: str) -> np.ndarray:
    values = column.dropna()
    try:
        indices = values.astype("int64").to_numpy()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold replica indices (ints), got {column.dtype}") from None
    if len(indices) and (indices.min() < 0 or not np.array_equal(indices, values.to_numpy())):
        raise ValueError(f"{name} must hold replica indices (ints >= 0)")
    return indices


def _count_of(indices: np.ndarray) -> int:
    return int(indices.max()) + 1 if len(indices) else 0


def _busy_length(begin: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals ``[begin, end)`` (already clipped)."""
    keep = end > begin
    begin, end = begin[keep], end[keep]
    if not len(begin):
        return 0.0
    order = np.argsort(begin, kind="stable")
    begin, end = begin[order], end[order]
    # An interval adds what lies past every earlier one's end (their union's right edge).
    reach = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    return float(np.clip(end - np.maximum(begin, reach), 0.0, None).sum())


def _utilizations(
    requests: pd.DataFrame, pool: _Pool, start: int | None, end: int | None
) -> np.ndarray:
    """Per replica of *pool*, the fraction of ``[start, end)`` it held a request."""
    if start is None or end is None or end <= start:
        return np.full(len(pool.indices), np.nan)
    length = float(end - start)
    begin_column, end_column = pool.hold(requests)
    begin = _relative(begin_column, start, math.nan)
    finish = _relative(end_column, start, length)
    replica = requests[pool.column].astype("Int64").to_numpy(dtype="float64", na_value=np.nan)
    held = ~np.isnan(begin) & ~np.isnan(replica)
    begin = np.clip(begin[held], 0.0, length)
    finish = np.clip(finish[held], 0.0, length)
    replica = replica[held]
    busy = [
        _busy_length(begin[replica == index], finish[replica == index]) for index in pool.indices
    ]
    return np.asarray(busy, dtype="float64") / length


def _per_replica(
    requests: pd.DataFrame,
    selected: pd.DataFrame,
    start: int | None,
    end: int | None,
    pool: _Pool,
) -> pd.DataFrame:
    """One row per replica of *pool*: the columns :func:`replica_summary` documents."""
    index = pd.Index(pool.indices, dtype="int64", name="replica")
    where = selected[pool.column].astype("Int64")
    groups = selected.groupby(where)
    # Counted as numbers (an empty selection's string column would refuse a 0 fill).
    finished = (selected["state"].astype(str) == _FINISHED.name).astype("int64").groupby(where)
    data: dict[str, Any] = {
        "requests": groups.size().reindex(index, fill_value=0).astype("int64"),
        "finished": finished.sum().reindex(index, fill_value=0).astype("int64"),
        "prompt_tokens": groups["prompt_token_count"].sum().reindex(index, fill_value=0),
        "generated_tokens": groups["generated_token_count"].sum().reindex(index, fill_value=0),
        "utilization": pd.Series(_utilizations(requests, pool, start, end), index=index),
    }
    for column in ("ttft_us", "e2e_latency_us"):
        values = selected[column].astype("Float64").astype("float64")
        by_replica = values.groupby(selected[pool.column].astype("Int64"))
        data[f"{column}_mean"] = by_replica.mean().reindex(index)
        data[f"{column}_p99"] = by_replica.quantile(0.99).reindex(index)
    frame = pd.DataFrame(data, index=index)
    for column in ("prompt_tokens", "generated_tokens"):
        frame[column] = frame[column].astype("int64")
    for column in ("utilization", "ttft_us_mean", "ttft_us_p99"):
        frame[column] = frame[column].astype("float64")
    for column in ("e2e_latency_us_mean", "e2e_latency_us_p99"):
        frame[column] = frame[column].astype("float64")
    return frame.reset_index()


def _balance(
    requests: pd.DataFrame,
    selected: pd.DataFrame,
    start: int | None,
    end: int | None,
    pools: list[_Pool],
) -> dict[str, float]:
    """The load-balance rows of :func:`summarize`, per pool."""
    metrics: dict[str, float] = {}
    for pool in pools:
        table = _per_replica(requests, selected, start, end, pool)
        prefix = f"{pool.name}_" if pool.name else ""
        counts = table["requests"].to_numpy(dtype="float64")
        busy = table["utilization"].to_numpy(dtype="float64")
        some = len(table) > 0
        mean_count = float(counts.mean()) if some else math.nan
        known = some and not np.isnan(busy).any()
        metrics[f"{prefix}replicas"] = float(len(table))
        metrics[f"{prefix}replica_requests_min"] = float(counts.min()) if some else math.nan
        metrics[f"{prefix}replica_requests_max"] = float(counts.max()) if some else math.nan
        metrics[f"{prefix}replica_load_imbalance"] = (
            float(counts.max()) / mean_count if some and mean_count > 0 else math.nan
        )
        low = float(busy.min()) if known else math.nan
        high = float(busy.max()) if known else math.nan
        metrics[f"{prefix}replica_utilization_min"] = low
        metrics[f"{prefix}replica_utilization_mean"] = float(busy.mean()) if known else math.nan
        metrics[f"{prefix}replica_utilization_max"] = high
        metrics[f"{prefix}replica_utilization_spread"] = high - low
    return metrics


def replica_summary(
    requests: pd.DataFrame,
    *,
    replicas: int | tuple[int, int] | None = None,
    warmup_us: int | None = None,
    until_us: int | None = None,
) -> pd.DataFrame:
    """One row per replica of a cluster's :meth:`~simsim.Cluster.requests_frame`.

    Columns: ``replica`` (its index in the cluster; a disaggregated frame first has
    ``pool``, ``"prefill"`` or ``"decode"``), then, over the requests routed to it
    among those that arrived in the window: ``requests``, ``finished`` (how many of
    them finished, wherever), ``prompt_tokens`` and ``generated_tokens`` (their
    sums), ``utilization``, and ``ttft_us_mean``, ``ttft_us_p99``,
    ``e2e_latency_us_mean`` and ``e2e_latency_us_p99`` (linear interpolation, over the
    requests that have the value; ``NaN`` when none does).

    ``utilization`` is the fraction of the window in which the replica held at least
    one request: the length of the union of its requests' holding intervals inside the
    window, over the window's length (every request counts for the part of its interval
    inside the window, whether it arrived in the window or not). A request holds its
    replica over ``[admit, end)``, *end* being its finish or cancellation (a request
    still running when the frame was taken: the window's end). Disaggregated: a
    prefill replica holds a request over ``[admit, hand-off)``, the hand-off being its
    prefill's end (or ``[admit, end)`` if it never left: cancelled there, or a
    zero-output request that finished there), and a decode replica over
    ``[transfer start, end)``: from its admission there, which starts the KV transfer,
    to its end. A request whose transfer never completed (cancelled, or preempted,
    during it) has no ``transfer_start_us`` in the frame and counts for no decode
    replica. As in :func:`summarize`'s occupancy, a preempted request counts as held
    from its first admission on the replica to its end.

    The window and *replicas* are :func:`summarize`'s. ``ValueError`` for a frame
    without replica columns.
    """
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"replica_summary needs a requests_frame(); missing columns {missing}")
    pools = _replica_pools(requests, replicas, required=True)
    start_us, end_us, selected = _window(requests, warmup_us, until_us)
    tables = []
    for pool in pools:
        table = _per_replica(requests, selected, start_us, end_us, pool)
        if pool.name:
            table.insert(0, "pool", pd.Series(pool.name, index=table.index, dtype="str"))
        tables.append(table)
    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


# ---------------------------------------------------------------------- request classes

CLASS_KEYS = ("request_class", "tenant")
"""The columns :func:`class_summary` can group by (``"class"`` is accepted for the first)."""

NO_CLASS = "(none)"
"""The column of :func:`class_summary` for requests that name no class (or no tenant)."""

_ALL_CLASSES = "*"
_SLO_KEYS = ("ttft_us", "tpot_us")


def class_summary(
    requests: pd.DataFrame,
    by: str = "request_class",
    *,
    slo: Mapping[str, Any] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    warmup_us: int | None = None,
    until_us: int | None = None,
    prompt_weight: float = 1.0,
    output_weight: float = 2.0,
) -> pd.DataFrame:
    """:func:`summarize` per request class or per tenant: one column per class.

    *by* is ``"request_class"`` (or ``"class"``) or ``"tenant"``: the
    :func:`requests_frame` column whose values name the columns of the result, sorted,
    with requests that name none in the column :data:`NO_CLASS` (last). A frame without
    that column (no request carried metadata) gives that one column. The index is
    ``metric`` and every value is a ``float64``.

    Each column holds the rows :func:`summarize` gives, from ``requests`` to
    ``goodput_requests_per_s``, over that class's requests among those that arrived in
    the window. The window is the whole frame's (``warmup_us`` and ``until_us`` as in
    :func:`summarize`; by default first arrival to last finish), so every class's
    ``makespan_us`` is the same and its throughputs are per second of that common
    window: the classes' throughputs add up to the whole run's.

    **SLO targets** (*slo*), per class: ``{"chat": {"ttft_us": 200_000, "tpot_us":
    50_000}, "batch": {"ttft_us": 5_000_000}}``, a target left out is not checked; a
    value may also be a pair ``(ttft_us, tpot_us)`` with ``None`` for no target. The key
    ``"*"`` gives the targets of every class not named; ``{"ttft_us": x, "tpot_us": y}``
    alone (no class keys) is one target for all classes. Attainment and goodput are
    :func:`summarize`'s, per class with its own targets; a class without targets has no
    value (``NaN``) in those two rows. A class named in *slo* that has no request in
    the frame still gets a column (``requests`` 0), so a misspelt class name shows.

    **Fairness** (``by="tenant"``) adds rows after the others, measured over the window
    ``[warmup_us, until_us)`` (a bound not given does not limit it):

    - ``service_tokens``: the service the tenant received *during* the window, in
      weighted tokens: ``prompt_weight * prompt_token_count`` for each of its requests
      first admitted in the window, plus ``output_weight`` per token it generated in
      the window (whenever the request arrived; a request's tokens are taken as evenly
      spaced from its first token to its finish, since the frame keeps no per-token
      times). The weights are those of
      :class:`~simsim.schedulers.fair.FairShareScheduler` (defaults 1 and 2);
    - ``demand_tokens``: what its requests that arrived in the window asked for,
      ``prompt_weight * prompt_token_count + output_weight * max_output_tokens``;
    - ``service_share``: its ``service_tokens`` over all tenants' (``NaN`` when none);
    - ``jain_fairness_index``: Jain's index of the ``service_tokens`` of the tenants
      that were backlogged in the window (had a request that arrived before the window's
      end and had not finished before its start), ``(sum x)^2 / (n * sum x^2)``, the
      same value in every column: 1 when all of them received equal service, ``1 / n``
      when one received it all, ``NaN`` when none received any. Equal service is the
      fair outcome when every tenant asks for more than an equal share, so choose a
      window in which they all stay backlogged; a tenant that asks for less lowers the
      index even when it received all it asked for (compare ``service_tokens`` with
      ``demand_tokens``). With no window, every tenant's whole service counts, and the
      index then compares the tenants' demands rather than the scheduler.
    """
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"class_summary needs a requests_frame(); missing columns {missing}")
    column = "request_class" if by == "class" else by
    if column not in CLASS_KEYS:
        raise ValueError(
            f"class_summary: by must be 'request_class' (or 'class') or 'tenant', got {by!r}"
        )
    labels = [(percentile_label(q), q / 100.0) for q in _check_percentiles(percentiles)]
    targets = _class_targets(slo)
    weights = (
        check_weight(prompt_weight, "prompt_weight"),
        check_weight(output_weight, "output_weight"),
    )
    start_us, end_us, selected = _window(requests, warmup_us, until_us)
    names = _class_names(requests, column)
    in_window = _class_names(selected, column)
    classes = sorted(
        {name for name in names.dropna()} | {name for name in targets if name != _ALL_CLASSES}
    )
    if names.isna().any():
        classes.append(NO_CLASS)
    columns: dict[str, dict[str, float]] = {}
    for name in classes:
        rows = selected[(in_window.fillna(NO_CLASS) == name).to_numpy(dtype=bool)]
        ttft, tpot = targets.get(name, targets.get(_ALL_CLASSES, (None, None)))
        columns[name] = _request_metrics(rows, start_us, end_us, labels, ttft, tpot)
    if slo is not None:
        # Same rows in every column: a class without targets gets NaN in the SLO rows.
        for metrics in columns.values():
            metrics.setdefault("slo_attainment", math.nan)
            metrics.setdefault("goodput_requests_per_s", math.nan)
    if column == "tenant":
        low = -math.inf if warmup_us is None else float(warmup_us)
        high = math.inf if until_us is None else float(until_us)
        _add_fairness(columns, requests, selected, column, (low, high), weights)
    # Every column has the same rows, in summarize's order (an empty frame: its rows).
    empty = selected.iloc[:0]
    order = list(
        columns[classes[0]] if classes else _request_metrics(empty, None, None, labels, None, None)
    )
    frame = pd.DataFrame(
        {name: [metrics[row] for row in order] for name, metrics in columns.items()},
        index=pd.Index(order),
        columns=pd.Index(classes, name=column),
        dtype="float64",
    )
    frame.index.name = "metric"
    return frame


def _class_names(requests: pd.DataFrame, column: str) -> pd.Series:
    """Each request's class (or tenant) as a string, ``<NA>`` where it names none."""
    if column not in requests.columns:
        return pd.Series(pd.NA, index=requests.index, dtype="string")
    return requests[column].astype("string")


def _class_targets(slo: Mapping[str, Any] | None) -> dict[str, tuple[float | None, float | None]]:
    """*slo* read into ``class -> (ttft_slo_us, tpot_slo_us)``, checked."""
    if slo is None:
        return {}
    if not isinstance(slo, Mapping):
        raise TypeError(f"slo must be a mapping of class -> targets, got {type(slo).__name__}")
    if (
        slo
        and all(key in _SLO_KEYS for key in slo)
        and not any(isinstance(value, Mapping | tuple | list) for value in slo.values())
    ):
        return {_ALL_CLASSES: _class_target(slo, "slo")}
    targets = {}
    for name, value in slo.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"slo keys must be class names (non-empty str), got {name!r}")
        targets[name] = _class_target(value, f"slo[{name!r}]")
    return targets


def _class_target(value: object, where: str) -> tuple[float | None, float | None]:
    if isinstance(value, Mapping):
        unknown = [key for key in value if key not in _SLO_KEYS]
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {unknown}; the targets are 'ttft_us' and 'tpot_us'"
            )
        pair = (value.get("ttft_us"), value.get("tpot_us"))
    elif isinstance(value, tuple | list) and len(value) == 2:
        pair = (value[0], value[1])
    else:
        raise TypeError(
            f"{where} must be a mapping {{'ttft_us': ..., 'tpot_us': ...}} or a pair "
            f"(ttft_us, tpot_us), got {value!r}"
        )
    ttft, tpot = (
        None if target is None else _non_negative_real(target, f"{where} {key}")
        for target, key in zip(pair, _SLO_KEYS, strict=True)
    )
    return ttft, tpot


def _add_fairness(
    columns: dict[str, dict[str, float]],
    requests: pd.DataFrame,
    selected: pd.DataFrame,
    column: str,
    window: tuple[float, float],
    weights: tuple[float, float],
) -> None:
    """Append the fairness rows of :func:`class_summary` to each tenant's metrics."""
    prompt_weight, output_weight = weights
    low, high = window
    admit = _relative(requests["admit_time_us"], 0, math.nan)
    prompts = requests["prompt_token_count"].to_numpy(dtype="float64")
    service = prompt_weight * prompts * ((admit >= low) & (admit < high))
    service += output_weight * _tokens_in_window(requests, low, high)
    arrival = _relative(requests["arrival_time_us"], 0, math.nan)
    finish = _relative(requests["finish_time_us"], 0, math.inf)
    present = (arrival < high) & (finish >= low)
    names = _class_names(requests, column).fillna(NO_CLASS).to_numpy(dtype=object)
    asked = _class_names(selected, column).fillna(NO_CLASS).to_numpy(dtype=object)
    demand = prompt_weight * selected["prompt_token_count"].to_numpy(
        dtype="float64"
    ) + output_weight * selected["max_output_tokens"].to_numpy(dtype="float64")
    served = {name: float(service[names == name].sum()) for name in columns}
    for name, metrics in columns.items():
        metrics["service_tokens"] = served[name]
        metrics["demand_tokens"] = float(demand[asked == name].sum())
    total = sum(served.values())
    backlogged = np.asarray([served[name] for name in columns if present[names == name].any()])
    squares = float((backlogged**2).sum())
    jain = float(backlogged.sum()) ** 2 / (len(backlogged) * squares) if squares > 0 else math.nan
    for name, metrics in columns.items():
        metrics["service_share"] = served[name] / total if total > 0 else math.nan
        metrics["jain_fairness_index"] = jain


def _tokens_in_window(requests: pd.DataFrame, low: float, high: float) -> np.ndarray:
    """Per request, how many of its generated tokens fall in ``[low, high)``.

    A request's tokens are taken as evenly spaced from its first token to its finish
    (the frame keeps no per-token times); a request with no finish yet counts all its
    tokens at its first token's time.
    """
    tokens = requests["generated_token_count"].to_numpy(dtype="float64")
    first = _relative(requests["first_token_time_us"], 0, math.nan)
    finish = _relative(requests["finish_time_us"], 0, math.nan)
    unfinished = np.isnan(finish)
    finish = np.where(unfinished, first, finish)
    step = np.where(tokens >= 2, (finish - first) / np.maximum(tokens - 1, 1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Token i (0-based) is at first + i * step: count the i in [0, tokens) with
        # low <= first + i * step < high.
        begin = np.where(step > 0, np.ceil((low - first) / step), np.where(first >= low, 0, np.inf))
        stop = np.where(step > 0, np.ceil((high - first) / step), np.where(first < high, np.inf, 0))
    count = np.clip(stop, 0, tokens) - np.clip(begin, 0, tokens)
    return np.where(np.isnan(first), 0.0, np.clip(np.nan_to_num(count), 0, None))


# ---------------------------------------------------------------------- a run's tables


class RecordedServer(Protocol):
    """What :func:`run_tables` reads of a server: its result frames.

    Every engine and every cluster has them. A cluster also has ``replicas`` (and a
    disaggregated one ``prefill_replicas`` and ``decode_replicas``); an engine has
    ``max_active_requests``; a batching engine (or a cluster with one) has
    ``iterations_frame()``. :func:`run_tables` reads those public properties where they
    exist and nothing else.
    """

    def requests_frame(self) -> pd.DataFrame:
        """One row per request (:func:`requests_frame`)."""
        ...

    def events_frame(self) -> pd.DataFrame:
        """One row per logged event (:func:`events_frame`)."""
        ...

    def admissions_frame(self) -> pd.DataFrame:
        """One row per admission (:func:`admissions_frame`)."""
        ...


def server_replicas(server: object) -> tuple[Any, ...]:
    """The engines that do *server*'s work: a cluster's ``replicas``, else the server."""
    replicas = getattr(server, "replicas", None)
    return (server,) if replicas is None else tuple(replicas)


def server_slots(
    server: object,
) -> tuple[int | tuple[int, int], int | tuple[int, int] | None]:
    """The ``slots`` and ``replicas`` :func:`summarize` takes for *server*'s requests frame.

    Slots: every replica's ``max_active_requests`` summed (a server's own for one
    server); for a disaggregated cluster a pair, the prefill pool's and the decode
    pool's. Replicas: ``None`` for one server, a cluster's replica count, or a pair of
    pool sizes for a disaggregated cluster.
    """
    replicas = server_replicas(server)
    prefill = getattr(server, "prefill_replicas", None)
    decode = getattr(server, "decode_replicas", None)
    if prefill is not None and decode is not None:
        slots = (
            sum(replica.max_active_requests for replica in prefill),
            sum(replica.max_active_requests for replica in decode),
        )
        return slots, (len(prefill), len(decode))
    total = sum(replica.max_active_requests for replica in replicas)
    return total, (len(replicas) if hasattr(server, "replicas") else None)


def server_kv_blocks(server: object) -> int | dict[int, int] | None:
    """The ``kv_blocks`` :func:`batch_summary` takes for *server*: its KV cache's size
    in blocks for one server, each replica's (by position) for a cluster whose replicas
    have KV caches, ``None`` without any."""
    replicas = server_replicas(server)
    blocks = {}
    for index, replica in enumerate(replicas):
        cache = getattr(replica, "kv_cache", None)
        if cache is not None:
            blocks[index] = cache.total_blocks
    if not blocks:
        return None
    return blocks[0] if len(replicas) == 1 else blocks


def run_summary(
    server: RecordedServer,
    *,
    requests: pd.DataFrame | None = None,
    ttft_slo_us: float | None = None,
    tpot_slo_us: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> pd.DataFrame:
    """:func:`summarize` of *server*'s run with its slots and replicas
    (:func:`server_slots`): the occupancy rows (``mean_queue_length``,
    ``mean_active_requests``, ``utilization``) and, for a cluster, every replica's
    load-balance rows, a replica given nothing included, then the overload rows of
    :func:`simsim.overload.overload_check` over the whole run: ``overloaded`` (1 or 0),
    ``arrival_rate_requests_per_s`` and ``completion_rate_requests_per_s`` (over the
    span in which requests arrive) and ``queue_growth`` (the queue's fitted growth over
    that span's second half, in requests). *requests* is the server's
    :meth:`requests_frame` when already made; the SLO targets and *percentiles* are
    :func:`summarize`'s.
    """
    slots, replicas = server_slots(server)
    frame = server.requests_frame() if requests is None else requests
    summary = summarize(
        frame,
        ttft_slo_us=ttft_slo_us,
        tpot_slo_us=tpot_slo_us,
        percentiles=percentiles,
        slots=slots,
        replicas=replicas,
    )
    verdict = overload_check(frame)
    values = (
        float(verdict.overloaded),
        verdict.arrival_rate_per_s,
        verdict.completion_rate_per_s,
        verdict.queue_growth,
    )
    for name, value in zip(OVERLOAD_METRICS, values, strict=True):
        summary.loc[name, "value"] = value
    return summary


def run_tables(
    server: RecordedServer, *, requests: pd.DataFrame | None = None
) -> dict[str, pd.DataFrame]:
    """The tables of *server*'s run, as a results folder holds them, the summary included.

    Keys, in order: ``requests``, ``events``, ``admissions``, then ``iterations`` when a
    batching engine did the work (the server, or a replica of a cluster), then
    ``summary``: :func:`run_summary` (the requests summarised with the server's slot
    and replica counts) as a frame with a ``metric`` and a ``value`` column.

    A cluster's tables are its merged frames (a ``replica`` column in each). This is
    what ``simsim run`` and ``simsim serve --record`` write; each run of a sweep or a
    capacity search summarises with :func:`run_summary` too. *requests* is the server's
    :meth:`requests_frame` when already made (a vLLM scenario's, with
    :data:`CLIENT_COLUMNS` appended: :meth:`simsim.scenario.Scenario.requests_frame`).
    """
    frames = {
        "requests": server.requests_frame() if requests is None else requests,
        "events": server.events_frame(),
        "admissions": server.admissions_frame(),
    }
    if any(hasattr(replica, "iterations_frame") for replica in server_replicas(server)):
        frames["iterations"] = cast(Any, server).iterations_frame()
    frames["summary"] = run_summary(server, requests=frames["requests"]).reset_index()
    return frames


# ---------------------------------------------------------------------- server load


def batch_summary(
    iterations: pd.DataFrame,
    events: pd.DataFrame,
    *,
    kv_blocks: int | Mapping[int, int] | None = None,
) -> pd.Series:
    """A batching server's load over its run, from its iterations and events frames.

    Rows (``float64``): ``iterations`` (launched, abandoned ones included),
    ``preemptions`` (``REQUEST_PREEMPTED`` events), ``mean_batch_size`` (requests per
    iteration, averaged over simulated time: each iteration that ran weighs as long as
    it lasted, so an idle stretch between iterations does not count), and with
    *kv_blocks*, ``kv_cache_blocks`` (how many in all), ``kv_cache_use_mean`` (the
    time-weighted mean fraction of the KV cache's blocks in use) and
    ``kv_cache_use_peak`` (the highest fraction). ``mean_batch_size`` and the KV rows
    are ``NaN`` when no iteration ran for a positive time.

    *kv_blocks* is the KV cache's size in blocks: an int for one server, or for a
    cluster's frames (a ``replica`` column) a mapping replica index -> its cache's
    blocks, each replica's use then taken as a share of its own cache (a replica not
    in the mapping, with no KV cache, counts for no KV row).
    """
    preemptions = int((events["event_type"] == EventType.REQUEST_PREEMPTED.name).sum())
    ran = iterations[~iterations["abandoned"].astype(bool)]
    weights = (ran["end_us"] - ran["start_us"]).astype("float64")
    rows = {
        "iterations": float(len(iterations)),
        "preemptions": float(preemptions),
        "mean_batch_size": math.nan,
    }
    if kv_blocks is not None:
        if isinstance(kv_blocks, Mapping):
            kv_blocks = {
                replica: check_positive_int(blocks, f"kv_blocks[{replica!r}]")
                for replica, blocks in kv_blocks.items()
            }
        else:
            kv_blocks = check_positive_int(kv_blocks, "kv_blocks")
        total = kv_blocks if isinstance(kv_blocks, int) else sum(kv_blocks.values())
        rows.update(kv_cache_blocks=float(total), kv_cache_use_mean=math.nan)
        rows["kv_cache_use_peak"] = math.nan
    if ran.empty or weights.sum() <= 0:
        return pd.Series(rows, dtype="float64")
    rows["mean_batch_size"] = float((ran["batch_size"] * weights).sum() / weights.sum())
    if isinstance(kv_blocks, int):
        used = float((ran["kv_blocks_in_use"] * weights).sum() / weights.sum())
        rows["kv_cache_use_mean"] = used / kv_blocks
        rows["kv_cache_use_peak"] = int(ran["kv_blocks_in_use"].max()) / kv_blocks
    elif kv_blocks is not None:
        held = ran["kv_blocks_in_use"] / ran["replica"].map(dict(kv_blocks)).astype("float64")
        rows["kv_cache_use_mean"] = float((held * weights).sum() / weights.sum())
        rows["kv_cache_use_peak"] = float(held.max())
    return pd.Series(rows, dtype="float64")


def prefix_cache_summary(requests: pd.DataFrame) -> pd.Series:
    """How much a prefix cache served, from a :func:`requests_frame` with
    ``cached_prompt_tokens`` (a batching server with a prefix cache).

    Rows (``float64``): ``requests``, ``hit_requests`` (requests served any prompt
    token from the cache), ``prompt_tokens``, ``cached_prompt_tokens``, and
    ``hit_rate_tokens`` (cached over all prompt tokens; ``NaN`` without prompt tokens)
    and ``hit_rate_requests`` (``NaN`` without requests): :func:`summarize`'s
    ``prefix_cache_hit_rate_tokens`` and ``_requests`` rows are these two.
    """
    if "cached_prompt_tokens" not in requests.columns:
        raise ValueError(
            "prefix_cache_summary needs a requests frame with cached_prompt_tokens: the "
            "frame of a batching server with a prefix cache (prefix_cache=True); this one "
            "has no such column"
        )
    cached = requests["cached_prompt_tokens"].astype("float64")
    prompts = float(requests["prompt_token_count"].sum())
    total = len(requests)
    hits = float((cached > 0).sum())
    rows = {
        "requests": float(total),
        "hit_requests": hits,
        "prompt_tokens": prompts,
        "cached_prompt_tokens": float(cached.sum()),
        "hit_rate_tokens": float(cached.sum()) / prompts if prompts else math.nan,
        "hit_rate_requests": hits / total if total else math.nan,
    }
    return pd.Series(rows, dtype="float64")


def replica_requests(
    requests: pd.DataFrame, *, replicas: int | tuple[int, int] | None = None
) -> pd.DataFrame:
    """How many requests each replica of a cluster was routed and saw through.

    One row per replica, in index order, from a cluster's
    :meth:`~simsim.Cluster.requests_frame`: ``replica``, ``pool`` (``""`` for a
    cluster's replicas, ``"prefill"`` or ``"decode"`` for a disaggregated cluster's),
    ``routed`` (requests routed there: for a decode replica, handed to it),
    ``finished`` (of those, how many finished there: on a prefill replica, the ones
    that never left it) and ``handed_off`` (``Int64``: on a prefill replica, how many
    it handed to a decode replica; ``<NA>`` on the others). Every request counts, the
    whole frame (no measurement window: :func:`replica_summary` has one).
    *replicas* is :func:`summarize`'s: the replica count (a pair for a disaggregated
    frame), so that a replica given nothing has its row.
    """
    pools = _replica_pools(requests, replicas, required=True)
    finished = requests["state"] == _FINISHED.name
    handed = requests[_DECODE_COLUMN].notna() if _DECODE_COLUMN in requests else None
    tables = []
    for pool in pools:
        stays = finished if pool.name != "prefill" or handed is None else finished & ~handed
        index = pd.Index(pool.indices, dtype="int64", name="replica")
        table = pd.DataFrame(
            {
                "pool": pd.Series(pool.name, index=index, dtype="str"),
                "routed": _counts(requests[pool.column], index),
                "finished": _counts(requests[pool.column][stays], index),
                "handed_off": pd.Series(pd.NA, index=index, dtype="Int64"),
            },
            index=index,
        )
        if pool.name == "prefill" and handed is not None:
            handed_off = _counts(requests[pool.column][handed], index)
            table["handed_off"] = handed_off.astype("Int64")
        tables.append(table)
    return pd.concat(tables).reset_index()


def _counts(column: pd.Series, index: pd.Index) -> pd.Series:
    """How often each replica of *index* appears in *column*: one count over the
    column, not a comparison per replica (fleets are large)."""
    counts = column.dropna().astype("int64").value_counts()
    return counts.reindex(index, fill_value=0).astype("int64")


def transfer_summary(requests: pd.DataFrame) -> pd.Series:
    """The KV transfers of a disaggregated cluster's :meth:`~simsim.Cluster.requests_frame`.

    Rows (``float64``): ``transfers`` (requests whose KV cache moved to a decode
    replica: a ``transfer_us``), ``transfer_us_mean`` and ``transfer_us_max`` (``NaN``
    without a transfer). A frame without ``transfer_us`` gives no transfer.
    """
    rows = {"transfers": 0.0, "transfer_us_mean": math.nan, "transfer_us_max": math.nan}
    if "transfer_us" in requests:
        moved = requests["transfer_us"].dropna()
        if len(moved):
            rows["transfers"] = float(len(moved))
            rows["transfer_us_mean"] = float(moved.mean())
            rows["transfer_us_max"] = float(moved.max())
    return pd.Series(rows, dtype="float64")


# ---------------------------------------------------------------------- series over time

REPLICA_LOAD_WINDOWS: Final = 200
"""How many equal time windows :func:`replica_load_series` (and the replica load heat
map) has by default."""


def occupancy_series(requests: pd.DataFrame) -> pd.DataFrame:
    """Queue length and slot occupancy over time, rebuilt from a requests table.

    A request is *queued* from its arrival until it is admitted or cancelled, whichever
    comes first (a request cancelled before it arrives never queues), and *occupies* a
    slot from its admission until it finishes or is cancelled. A request still queued
    or active at the end of the table (no admit or finish time) stays counted.

    Returns columns ``time_us``, ``queue_length`` and ``occupancy`` (all ``int64``):
    one row at time 0 and one at every later time where a count changes, holding
    the counts after every change at that time, so the counts at any time ``t >= 0`` are
    those of the last row with ``time_us <= t``. Zero-length stays (admitted and
    cancelled at once) leave no trace.

    A disaggregated cluster's table (``prefill_replica`` and ``decode_replica``) has a
    queue and slots per pool, and the columns ``prefill_queue_length``,
    ``prefill_occupancy``, ``decode_queue_length`` and ``decode_occupancy`` follow,
    with ``queue_length`` and ``occupancy`` their sums. A request queues for a prefill
    slot from its arrival to its prefill admission and holds it until its hand-off (or
    its end, if it never left); it queues for a decode slot from its hand-off to its
    admission on the decode replica and holds that slot until its end. These are the
    intervals of :func:`summarize`'s occupancy rows, whose time averages over the
    window are those of these counts.

    Limitation: the requests table keeps one admission time per pool, so a request
    preempted and readmitted by a batching server is counted as active from its first
    admission.
    """
    stages = _occupancy_pools(_replica_pools(requests, None, required=False))
    changes: dict[str, pd.Series[int]] = {}
    for pool in stages:
        begin, end = pool.queued(requests)
        queued = begin.notna()
        changes[f"{pool.prefix}queue_length"] = _deltas(begin[queued], end[queued])
        begin, end = pool.hold(requests)
        held = begin.notna()
        changes[f"{pool.prefix}occupancy"] = _deltas(begin[held], end[held])
    times = np.array([0], dtype=np.int64)
    for steps in changes.values():
        times = np.union1d(times, steps.index)
    counts = {
        name: steps.reindex(times, fill_value=0).cumsum().to_numpy(dtype=np.int64)
        for name, steps in changes.items()
    }
    if len(stages) == 2:
        counts = {
            "queue_length": counts["prefill_queue_length"] + counts["decode_queue_length"],
            "occupancy": counts["prefill_occupancy"] + counts["decode_occupancy"],
            **counts,
        }
    keep = np.ones(len(times), dtype=bool)
    keep[1:] = False
    for values in counts.values():
        keep[1:] |= values[1:] != values[:-1]
    columns = {name: values[keep] for name, values in counts.items()}
    return pd.DataFrame({"time_us": times[keep].astype(np.int64), **columns})


def _deltas(start: pd.Series[int], end: pd.Series[int]) -> pd.Series[int]:
    """+1 at each start and -1 at each end, summed per time; open intervals never end."""
    start_values = start.to_numpy(dtype=np.int64)
    open_ended = end.isna().to_numpy(dtype=bool)
    end_values = end.fillna(0).to_numpy(dtype=np.int64)
    nonempty = open_ended | (end_values > start_values)
    closes = nonempty & ~open_ended
    times = np.concatenate([start_values[nonempty], end_values[closes]])
    steps = np.concatenate(
        [np.ones(int(nonempty.sum()), np.int64), -np.ones(int(closes.sum()), np.int64)]
    )
    if len(times) == 0:
        return pd.Series(np.zeros(0, np.int64), index=np.zeros(0, np.int64), dtype="int64")
    return pd.Series(steps, index=times, dtype="int64").groupby(level=0).sum()


def replica_load_series(
    requests: pd.DataFrame, end_us: int, windows: int = REPLICA_LOAD_WINDOWS
) -> tuple[npt.NDArray[np.float64], list[tuple[str, range, npt.NDArray[np.float64]]]]:
    """The time-weighted mean number of requests on each replica, per time window.

    A request is *on* a replica from its routing there until it leaves: on a cluster's
    replica from its arrival to its finish or cancellation (queued or running); on a
    disaggregated cluster's prefill replica from its arrival to its hand-off (its
    prefill's end; its end if it never left), and on its decode replica from the
    hand-off to its end, queued, receiving its KV cache, or decoding. A request still
    there at the end of the table stays counted.

    Returns the *windows* + 1 window edges over ``[0, end_us]`` (``end_us > 0``) and,
    per pool (``""`` for a cluster, ``"prefill"`` and ``"decode"`` for a disaggregated
    one), its name, its replicas' indices and a (replicas x windows) array of means.
    The replicas are those the table names, from index 0 to the highest.
    """
    edges = np.linspace(0.0, float(end_us), windows + 1)
    pools = []
    for pool in _replica_pools(requests, None, required=True):
        begin, end = pool.outstanding(requests)
        replica = requests[pool.column].astype("Int64")
        on = (replica.notna() & begin.notna()).to_numpy(dtype=bool)
        means = np.zeros((len(pool.indices), windows))
        for row, index in enumerate(pool.indices):
            mine = on & (replica == index).fillna(False).to_numpy(dtype=bool)
            steps = _deltas(begin[mine], end[mine])
            if len(steps) == 0:
                continue
            times = steps.index.to_numpy(dtype=np.int64)
            counts = np.asarray(steps.cumsum().to_numpy(), dtype=np.int64)
            means[row] = time_weighted_means(times, counts, end_us, windows)[1]
        pools.append((pool.name, pool.indices, means))
    return edges, pools


def time_weighted_means(
    times: npt.NDArray[np.int64], values: npt.NDArray[np.int64], end: int, windows: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Window centres and time-weighted means of a step function over ``[0, end)``.

    The function is *values[i]* from *times[i]* to the next time (the last value to
    *end*); the window ``[0, end)`` is cut into *windows* equal windows, and each gets
    the mean of the function over it, every value weighed by how long it held there.
    """
    breaks = np.append(times, end).astype(np.float64)
    area = np.concatenate([[0.0], np.cumsum(values * np.diff(breaks))])
    edges = np.linspace(0.0, float(end), windows + 1)
    totals = np.diff(np.interp(edges, breaks, area))
    return (edges[:-1] + edges[1:]) / 2, totals / np.diff(edges)


def token_rates(iterations: pd.DataFrame, end_us: int, windows: int) -> pd.DataFrame:
    """Prefill and decode tokens per simulated second of a batching server, in *windows*
    equal time windows over ``[0, end_us)`` (``end_us > 0``).

    From an :meth:`~simsim.BatchingEngine.iterations_frame`: each completed iteration
    counts in the window holding its end, when its tokens are done (``prefill_tokens``
    prefill tokens, one decode token per decoding request); abandoned iterations
    processed nothing and are left out. Columns ``window_start_us``, ``window_end_us``
    (floats: the windows need not fall on whole microseconds),
    ``prefill_tokens_per_s`` and ``decode_tokens_per_s``.
    """
    done = ~iterations["abandoned"].astype(bool).to_numpy()
    ends = iterations["end_us"].to_numpy(dtype=np.int64)[done]
    prefill = iterations["prefill_tokens"].to_numpy(dtype=np.int64)[done]
    decode = iterations["decoding_count"].to_numpy(dtype=np.int64)[done]
    edges = np.linspace(0.0, float(end_us), windows + 1)
    per_second = 1e6 / (float(end_us) / windows)
    return pd.DataFrame(
        {
            "window_start_us": edges[:-1],
            "window_end_us": edges[1:],
            "prefill_tokens_per_s": np.histogram(ends, bins=edges, weights=prefill)[0] * per_second,
            "decode_tokens_per_s": np.histogram(ends, bins=edges, weights=decode)[0] * per_second,
        }
    )
