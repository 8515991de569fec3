"""Results as pandas DataFrames: requests, events, admissions, and a summary.

These functions read what an engine recorded and never change it. Every timestamp and
integer duration column has pandas' nullable ``Int64`` dtype, so a time that never
happened is ``<NA>``, never a sentinel number. ``tpot_us`` is a nullable ``Float64``.

Derived latency columns (all in microseconds, from the request's own timestamps):

- ``queue_delay_us`` = admit - arrival (admitted requests);
- ``ttft_us`` = first token - arrival (requests that produced a token);
- ``e2e_latency_us`` = finish - arrival (``FINISHED`` requests only);
- ``tpot_us`` = (finish - first token) / (tokens - 1) (``FINISHED`` with 2+ tokens).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from simsim.records import ITERATION_COLUMNS, AdmissionLog, EventLog, EventType
from simsim.request import Request, RequestState

if TYPE_CHECKING:
    from simsim.engines.base import EngineBase

__all__ = [
    "DEFAULT_PERCENTILES",
    "REQUEST_COLUMNS",
    "admissions_frame",
    "events_frame",
    "iterations_frame",
    "percentile_label",
    "requests_frame",
    "summarize",
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

_FINISHED = RequestState.FINISHED
_LATENCY_COLUMNS = ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us")
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
    return pd.DataFrame({name: data[name] for name in REQUEST_COLUMNS})


def events_frame(log: EventLog) -> pd.DataFrame:
    """One row per logged event: ``timestamp_us, sequence, event_type, request_id``."""
    names = [member.name for member in EventType]
    return pd.DataFrame(
        {
            "timestamp_us": pd.array(log.timestamps, dtype="Int64"),
            "sequence": pd.array(log.sequences, dtype="int64"),
            "event_type": pd.array([names[k] for k in log.types], dtype="str"),
            "request_id": pd.array(log.request_ids, dtype="int64"),
        }
    )


def iterations_frame(records: Sequence[Any]) -> pd.DataFrame:
    """One row per batching iteration (see :class:`simsim.IterationRecord`).

    ``start_us`` and ``end_us`` are ``Int64``; an engine with no iterations gives an
    empty frame with the same columns.
    """
    columns: dict[str, Any] = {}
    for name in ITERATION_COLUMNS:
        values = [getattr(record, name) for record in records]
        dtype = "bool" if name == "abandoned" else ("Int64" if name.endswith("_us") else "int64")
        columns[name] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(columns)


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
    ttft_slo_us: int | None = None,
    tpot_slo_us: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> pd.DataFrame:
    """Summarise a :func:`requests_frame`: one row per metric, in a ``value`` column.

    Rows: ``requests`` and ``count_<STATE>`` for every state; ``makespan_us`` (first
    arrival to last finish); ``throughput_requests_per_s`` and
    ``throughput_tokens_per_s`` (finished requests and generated tokens per simulated
    second of makespan); then ``<column>_mean``, ``_p50``, ``_p90`` and ``_p99`` for
    ``queue_delay_us``, ``ttft_us``, ``e2e_latency_us`` and ``tpot_us`` over the rows
    where the value exists. Percentiles use linear interpolation (pandas' default);
    *percentiles* (numbers strictly between 0 and 100) chooses others, each named by
    :func:`percentile_label` (``99.9`` gives ``ttft_us_p99.9``).

    With ``ttft_slo_us`` and/or ``tpot_slo_us``, also ``slo_attainment`` (the fraction
    of all requests that finished and met every given target; a request with no
    ``tpot_us`` meets a TPOT target) and ``goodput_requests_per_s`` (those requests
    per simulated second of makespan). Missing values (no finished request, say) are
    ``NaN``.
    """
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"summarize needs a requests_frame(); missing columns {missing}")
    labels = [(percentile_label(q), q / 100.0) for q in _check_percentiles(percentiles)]
    metrics: dict[str, float] = {"requests": float(len(requests))}
    states = requests["state"].astype(str)
    for state in RequestState:
        metrics[f"count_{state.name}"] = float((states == state.name).sum())
    finished = states == RequestState.FINISHED.name
    makespan = _makespan_us(requests)
    metrics["makespan_us"] = makespan
    seconds = makespan / 1e6 if makespan and makespan > 0 else math.nan
    metrics["throughput_requests_per_s"] = float(finished.sum()) / seconds
    metrics["throughput_tokens_per_s"] = float(requests["generated_token_count"].sum()) / seconds
    for column in _LATENCY_COLUMNS:
        values = requests[column].dropna().astype("float64")
        metrics[f"{column}_mean"] = float(values.mean()) if len(values) else math.nan
        for label, q in labels:
            metrics[f"{column}_{label}"] = float(values.quantile(q)) if len(values) else math.nan
    if ttft_slo_us is not None or tpot_slo_us is not None:
        good = finished.to_numpy(dtype=bool, copy=True)
        if ttft_slo_us is not None:
            ttft = requests["ttft_us"].astype("Float64")
            # A zero-output request has no first token: TTFT counts as its e2e latency.
            ttft = ttft.fillna(requests["e2e_latency_us"].astype("Float64"))
            good &= (ttft <= ttft_slo_us).fillna(False).to_numpy(dtype=bool)
        if tpot_slo_us is not None:
            tpot = requests["tpot_us"].astype("Float64")
            good &= (tpot <= tpot_slo_us).fillna(True).to_numpy(dtype=bool)
        total = len(requests)
        metrics["slo_attainment"] = float(good.sum()) / total if total else math.nan
        metrics["goodput_requests_per_s"] = float(good.sum()) / seconds
    frame = pd.DataFrame({"value": pd.Series(metrics, dtype="float64")})
    frame.index.name = "metric"
    return frame


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


def _makespan_us(requests: pd.DataFrame) -> float:
    if requests.empty:
        return math.nan
    first = requests["arrival_time_us"].min()
    last = requests["finish_time_us"].max()
    if pd.isna(first) or pd.isna(last):
        return math.nan
    return float(last - first)


def frames_of(engine: EngineBase) -> dict[str, pd.DataFrame]:
    """All of an engine's frames by name: ``requests``, ``events``, ``admissions``."""
    return {
        "requests": engine.requests_frame(),
        "events": engine.events_frame(),
        "admissions": engine.admissions_frame(),
    }
