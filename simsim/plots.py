"""PNG figures drawn from a results folder written by ``simsim run`` or ``simsim sweep``.

:func:`plot_results` reads the tables of a results folder through
:func:`simsim.run_folder.read_run_folder` (which knows the folder's format and dtypes)
and writes:

- ``latency_cdf.png``: empirical CDFs of TTFT and end-to-end latency, in milliseconds;
- ``timeline.png``: queue length and slot occupancy over simulated time, rebuilt from
  the requests table by :func:`occupancy_series`;
- ``gantt.png``: one row per request (waiting, prefill, decoding; cancellations
  marked; a disaggregated cluster's KV transfers), only for runs of at most
  :data:`GANTT_MAX_REQUESTS` requests;
- ``replica_load.png``: for a cluster's folder (a requests table with replica
  columns), the requests on each replica over time, as a heat map (replica x time),
  drawn by :func:`draw_replica_load`.
- ``class_latency.png`` and ``tenant_latency.png``: when the requests table names
  request classes (or tenants), TTFT and end-to-end latency CDFs with one line per
  class (per tenant), drawn by :func:`draw_class_latency`.

:func:`plot_sweep` reads a sweep's folder and writes ``sweep_latency.png`` (TTFT, TPOT
and end-to-end percentiles) and ``sweep_throughput.png``, against load, one line per
configuration with the confidence interval shaded.

Only the result tables are read, never an engine. Every time shown is simulated from
the cost model, not measured on hardware, and every figure says so; a folder written by
``simsim replay`` holds measured times instead, and its figures say that (a client sees
no admission, so its timeline shows requests in flight and its Gantt chart the time to
the first token and the decoding after it).

Importing this module imports matplotlib (and selects its non-interactive ``Agg``
backend), so ``from simsim import plots`` raises ``ImportError`` when matplotlib is not
installed (``pip install 'simsim[plot]'``).

To add a figure, write a function ``(RunFolder) -> Figure | None`` (``None`` skips
it, e.g. when an optional table such as ``iterations`` is absent) and append a
:class:`FigureSpec` to :data:`FIGURES`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from simsim.results import (
    CLASS_KEYS,
    NO_CLASS,
    REPLICA_LOAD_WINDOWS,
    occupancy_series,
    replica_load_series,
    replica_pools,
    time_weighted_means,
    token_rates,
)
from simsim.run_folder import RunFolder, read_run_folder
from simsim.sweeps.folder import SweepFolder
from simsim.sweeps.stats import metric_range
from simsim.wording import counted

__all__ = [
    "CLASS_LINES",
    "FIGURES",
    "GANTT_MAX_REQUESTS",
    "ITERATIONS_BIN_AFTER",
    "ITERATION_WINDOWS",
    "FigureSpec",
    "SweepFolder",
    "draw_class_latency",
    "draw_gantt",
    "draw_iterations",
    "draw_latency_cdf",
    "draw_plan",
    "draw_replica_load",
    "draw_sweep_latency",
    "draw_sweep_throughput",
    "draw_timeline",
    "plot_results",
    "plot_sweep",
]

GANTT_MAX_REQUESTS: Final = 60
"""The Gantt chart is drawn only for runs of at most this many requests."""

TIMELINE_SMOOTH_AFTER: Final = 400
"""Above this many steps the timeline also draws windowed means of its counts."""

TIMELINE_WINDOWS: Final = 200
"""How many equal windows the timeline's windowed means use."""

ITERATIONS_BIN_AFTER: Final = 400
"""Above this many iterations the token panel shows tokens per second per time window."""

ITERATION_WINDOWS: Final = 150
"""How many equal time windows the binned token panel uses."""

CLASS_LINES: Final = 10
"""The per-class latency figure draws at most this many lines (the rest share one)."""

SIMULATED_NOTE: Final = "simulated times from the cost model, not measured on hardware"

MEASURED_NOTE: Final = "measured at the client by simsim replay, wall-clock times"


_WAIT_COLOR: Final = "#bdbdbd"
_PREFILL_COLOR: Final = "#ff7f0e"
_DECODE_COLOR: Final = "#1f77b4"
_CANCEL_COLOR: Final = "#d62728"
_TRANSFER_COLOR: Final = "#2ca02c"
_DPI: Final = 120
_QUEUE_COLORS: Final = ("0.35", "black")  # a count's colour, its windowed mean's
_SLOT_COLORS: Final = (_DECODE_COLOR, "#08306b")
_PREFILL_SLOT_COLORS: Final = (_PREFILL_COLOR, "#a63603")


class _WholeNumbers(MaxNLocator):
    """Ticks at whole numbers only, for an axis of counts or replica indices.

    ``MaxNLocator(integer=True)`` falls back to fractions when fewer than two whole
    numbers are in view (one replica's heat map row spans -0.5..0.5; a count that stays
    0); this locator then ticks the whole numbers in view, or the nearest one.
    """

    def __init__(self, nbins: int | Literal["auto"] = "auto") -> None:
        super().__init__(nbins=nbins, integer=True)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        ticks = np.asarray(super().tick_values(vmin, vmax), dtype=np.float64)
        if np.all(ticks == np.round(ticks)):
            return [float(tick) for tick in ticks]
        low, high = min(vmin, vmax), max(vmin, vmax)
        inside = [float(n) for n in range(math.ceil(low), math.floor(high) + 1)]
        return inside or [float(round((low + high) / 2))]


# ---------------------------------------------------------------------- reading


# ---------------------------------------------------------------------- series


# ---------------------------------------------------------------------- figures


def draw_latency_cdf(requests: pd.DataFrame, *, measured: bool = False) -> Figure:
    """Empirical CDFs of TTFT and end-to-end latency (ms), side by side.

    *measured*: the times come from ``simsim replay`` (the labels say so).
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True, layout="constrained")
    total = len(requests)
    for ax, column, label, why in (
        (axes[0], "ttft_us", "TTFT (time to first token)", "no first token"),
        (axes[1], "e2e_latency_us", "end-to-end latency", "not finished"),
    ):
        values_ms = np.sort(_present(requests[column])) / 1000.0
        n = len(values_ms)
        ax.set_title(label)
        kind = "measured" if measured else "simulated"
        ax.set_xlabel(f"{label.split(' (')[0]} (ms, {kind})")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if n == 0:
            _no_data(ax, f"no request has a {label.split(' (')[0]}")
            continue
        fraction = np.arange(1, n + 1) / n
        left_out = f"; {total - n} {why}" if total > n else ""
        ax.step(
            np.concatenate([[values_ms[0]], values_ms]),
            np.concatenate([[0.0], fraction]),
            where="post",
            color=_DECODE_COLOR,
            label=f"{n} of {counted(total, 'request')}{left_out}",
        )
        for q, style in ((0.5, ":"), (0.9, "--"), (0.99, "-.")):
            value = float(np.quantile(values_ms, q))
            ax.axvline(
                value,
                color="0.35",
                linestyle=style,
                linewidth=1,
                label=f"p{round(q * 100)} = {_fmt_ms(value)}",
            )
        ax.legend(loc="lower right", fontsize="small")
    axes[0].set_ylabel("fraction of requests")
    fig.suptitle(f"Latency CDFs ({MEASURED_NOTE if measured else SIMULATED_NOTE})")
    return fig


def draw_class_latency(
    requests: pd.DataFrame, by: str = "request_class", *, measured: bool = False
) -> Figure:
    """Empirical CDFs of TTFT and end-to-end latency (ms), one line per request class.

    *by* is the requests table's column that names the class: ``"request_class"`` or
    ``"tenant"``. Requests that name none form the line ``(none)``
    (:data:`simsim.results.NO_CLASS`). Above :data:`CLASS_LINES` classes, the largest
    ones keep a line each and the rest share one. The legend gives each line's request
    count and p99. *measured*: the times come from ``simsim replay``.
    """
    names = _class_column(requests, by)
    counts = names.value_counts(sort=False)
    ordered = sorted(counts.index, key=lambda name: (name == NO_CLASS, str(name)))
    if len(ordered) > CLASS_LINES:
        largest = set(sorted(ordered, key=lambda name: -int(counts[name]))[: CLASS_LINES - 1])
        rest = len(ordered) - len(largest)
        other = counted(rest, "other class", "other classes")
        names = names.where(names.isin(largest), other)
        ordered = [name for name in ordered if name in largest] + [other]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True, layout="constrained")
    kind = "measured" if measured else "simulated"
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    for ax, column, label in (
        (axes[0], "ttft_us", "TTFT"),
        (axes[1], "e2e_latency_us", "end-to-end latency"),
    ):
        ax.set_title(f"{label} per {'tenant' if by == 'tenant' else 'request class'}")
        ax.set_xlabel(f"{label} (ms, {kind})")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        drawn = False
        for number, name in enumerate(ordered):
            mine = (names == name).to_numpy(dtype=bool)
            values_ms = np.sort(_present(requests[column][mine])) / 1000.0
            n = len(values_ms)
            if n == 0:
                continue
            p99 = float(np.quantile(values_ms, 0.99))
            ax.step(
                np.concatenate([[values_ms[0]], values_ms]),
                np.concatenate([[0.0], np.arange(1, n + 1) / n]),
                where="post",
                color=colors[number % len(colors)],
                label=f"{name} ({n} of {int(mine.sum())}, p99 = {_fmt_ms(p99)})",
            )
            drawn = True
        if drawn:
            _log_x_if_wide(ax)
            ax.legend(loc="lower right", fontsize="small")
        else:
            _no_data(ax, f"no request has a {label}")
    axes[0].set_ylabel("fraction of the class's requests")
    fig.suptitle(f"Latency CDFs per class ({MEASURED_NOTE if measured else SIMULATED_NOTE})")
    return fig


def _log_x_if_wide(ax: Axes) -> None:
    """A log x axis when the lines' positive values span more than three decades
    (an interactive class beside a batch one)."""
    values = np.concatenate([np.asarray(line.get_xdata(), dtype=float) for line in ax.get_lines()])
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > 1000:
        ax.set_xscale("log")


def _class_column(requests: pd.DataFrame, by: str) -> pd.Series[str]:
    """Each request's class name (*by*'s value, or ``(none)``), as strings."""
    if by not in CLASS_KEYS:
        raise ValueError(f"by must be one of {CLASS_KEYS}, got {by!r}")
    if by not in requests.columns:
        return pd.Series(NO_CLASS, index=requests.index, dtype="object")
    return requests[by].astype("string").fillna(NO_CLASS).astype("object")


def draw_timeline(requests: pd.DataFrame, *, measured: bool = False) -> Figure:
    """Queue length and slot occupancy over simulated time, as step plots.

    When the counts change more than :data:`TIMELINE_SMOOTH_AFTER` times, each panel
    also shows the time-weighted mean over :data:`TIMELINE_WINDOWS` equal windows, which
    stays readable where the raw steps blur together. A disaggregated cluster's table
    gets the two panels per pool: the prefill queue and slots, then the decode queue
    (requests handed off, waiting for admission on their decode replica) and slots (see
    :func:`occupancy_series`). *measured* (a ``simsim replay`` folder, whose client
    never sees an admission): one panel, the requests in flight, from their send to
    their end.
    """
    if measured:
        requests = requests.assign(admit_time_us=requests["arrival_time_us"])
    series = occupancy_series(requests)
    times = series["time_us"].to_numpy(dtype=np.int64)
    end = max(int(times[-1]), _horizon_us(requests))
    scale, unit = _time_unit(end)
    x = np.append(times, end) / scale
    busy = len(series) > TIMELINE_SMOOTH_AFTER and end > 0
    # (column, axis label, legend, colour, colour of the windowed mean)
    panels: list[tuple[str, str, str, str, str]]
    if measured:
        panels = [("occupancy", "in flight", "sent, not yet done", _DECODE_COLOR, "#08306b")]
    elif "prefill_occupancy" in series.columns:
        panels = [
            (
                "prefill_queue_length",
                "prefill queue",
                "queued (arrived, not yet admitted)",
                *_QUEUE_COLORS,
            ),
            (
                "prefill_occupancy",
                "prefill slots",
                "prefilling (admitted, not yet handed off)",
                *_PREFILL_SLOT_COLORS,
            ),
            (
                "decode_queue_length",
                "decode queue",
                "handed off, not yet admitted for decode",
                *_QUEUE_COLORS,
            ),
            (
                "decode_occupancy",
                "decode slots",
                "admitted (receiving its KV cache or decoding)",
                *_SLOT_COLORS,
            ),
        ]
    else:
        panels = [
            ("queue_length", "queue length", "queued (arrived, not yet admitted)", *_QUEUE_COLORS),
            ("occupancy", "occupied slots", "active (admitted, not yet done)", *_SLOT_COLORS),
        ]
    height = {1: (4.0, (1,)), 2: (6.0, (3, 2)), 4: (9.0, (3, 2, 3, 2))}[len(panels)]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(11, height[0]),
        sharex=True,
        layout="constrained",
        height_ratios=height[1],
        squeeze=False,
    )
    for ax, (column, ylabel, what, color, mean_color) in zip(axes[:, 0], panels, strict=True):
        values = series[column].to_numpy(dtype=np.int64)
        y = np.append(values, values[-1])
        ax.step(
            x,
            y,
            where="post",
            color=color,
            linewidth=0.6 if busy else 1.2,
            alpha=0.45 if busy else 1,
        )
        ax.fill_between(x, y, step="post", color=color, alpha=0.15 if busy else 0.25, label=what)
        if busy:
            centers, means = time_weighted_means(times, values, end, TIMELINE_WINDOWS)
            window = end / TIMELINE_WINDOWS / scale
            ax.plot(
                centers / scale,
                means,
                color=mean_color,
                linewidth=1.6,
                label=f"time-weighted mean per {window:.3g} {unit} window",
            )
        ax.set_ylabel(f"{ylabel} (requests)")
        ax.set_ylim(0, max(1, int(values.max())) * 1.3)
        ax.yaxis.set_major_locator(_WholeNumbers())
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small", ncol=2)
    top, bottom = axes[0, 0], axes[-1, 0]
    if len(requests) == 0:
        _no_data(top, "no requests")
    bottom.set_xlim(0, end / scale if end > 0 else 1)
    if measured:
        bottom.set_xlabel(f"time since the replay started ({unit})")
        fig.suptitle(f"Requests in flight, {counted(len(requests), 'request')} ({MEASURED_NOTE})")
    else:
        bottom.set_xlabel(f"simulated time ({unit})")
        fig.suptitle(
            f"Queue length and slot occupancy, {counted(len(requests), 'request')} "
            f"({SIMULATED_NOTE})"
        )
    return fig


def draw_iterations(iterations: pd.DataFrame) -> Figure:
    """The batching server's iterations: batch size, KV blocks in use, tokens processed.

    The batch size and KV panels draw one step per iteration, from its start to its
    (planned) end; abandoned iterations are marked. With a prefix cache (a
    ``kv_blocks_cached`` column), the KV panel stacks the cached blocks on the blocks in
    use: the cache's occupancy. The token panel stacks prefill and
    decode tokens: per iteration for up to :data:`ITERATIONS_BIN_AFTER` iterations,
    beyond that as tokens per simulated second in :data:`ITERATION_WINDOWS` equal time
    windows (each completed iteration counted in the window of its end), so that
    thousands of iterations stay readable. Reads the ``iterations`` table that
    ``simsim run`` writes for ``engine = "batching"``.
    """
    frame = iterations.sort_values("start_us", kind="stable")
    starts = frame["start_us"].to_numpy(dtype=np.int64)
    ends = frame["end_us"].to_numpy(dtype=np.int64)
    end = int(ends.max()) if len(frame) else 0
    scale, unit = _time_unit(end)
    fig, axes = plt.subplots(3, 1, figsize=(11, 7.5), sharex=True, layout="constrained")
    panels = (
        ("batch_size", "requests in the batch", _DECODE_COLOR),
        ("kv_blocks_in_use", "KV blocks in use", "#6a3d9a"),
    )
    for ax, (column, label, color) in zip(axes[:2], panels, strict=False):
        values = frame[column].to_numpy(dtype=np.int64)
        if len(frame):
            ax.step(starts / scale, values, where="post", color=color, linewidth=1.0)
            ax.fill_between(starts / scale, values, step="post", color=color, alpha=0.2)
        ax.set_ylabel(label)
        ax.yaxis.set_major_locator(_WholeNumbers())
        ax.grid(True, alpha=0.3)
    if "kv_blocks_cached" in frame.columns and len(frame):
        # A prefix cache: blocks nobody holds that keep a cached prefix, stacked on top.
        held = frame["kv_blocks_in_use"].to_numpy(dtype=np.int64)
        cached = frame["kv_blocks_cached"].to_numpy(dtype=np.int64)
        kv = axes[1]
        kv.fill_between(
            starts / scale,
            held,
            held + cached,
            step="post",
            color="#b2df8a",
            alpha=0.7,
            label="cached prefix blocks (evictable)",
        )
        kv.set_ylabel("KV blocks")
        kv.legend(
            handles=[
                Patch(color="#6a3d9a", alpha=0.4, label="in use"),
                Patch(color="#b2df8a", label="cached prefix blocks (evictable)"),
            ],
            loc="upper right",
            fontsize="small",
        )
    tokens = axes[2]
    if len(frame):
        prefill = frame["prefill_tokens"].to_numpy(dtype=np.int64)
        decode = frame["decoding_count"].to_numpy(dtype=np.int64)
        abandoned = frame["abandoned"].astype(bool).to_numpy()
        if len(frame) > ITERATIONS_BIN_AFTER and end > 0:
            _draw_token_rates(tokens, token_rates(frame, end, ITERATION_WINDOWS), scale, unit)
        else:
            x = starts / scale
            # Stacked steps, not bars: hundreds of iterations draw in a blink this way.
            tokens.fill_between(
                x,
                prefill + decode,
                step="post",
                color=_DECODE_COLOR,
                alpha=0.6,
                label="decode tokens",
            )
            tokens.fill_between(
                x, prefill, step="post", color=_PREFILL_COLOR, alpha=0.8, label="prefill tokens"
            )
            tokens.set_ylabel("tokens per iteration")
            tokens.yaxis.set_major_locator(_WholeNumbers())
        if abandoned.any():
            tokens.plot(
                starts[abandoned] / scale,
                np.zeros(abandoned.sum()),
                "x",
                color="red",
                label="abandoned iteration",
            )
        tokens.legend(loc="upper right", fontsize="small")
    else:
        _no_data(tokens, "no iterations")
        tokens.set_ylabel("tokens per iteration")
    tokens.set_xlabel(f"simulated time ({unit})")
    tokens.grid(True, alpha=0.3)
    fig.suptitle(
        f"Batching iterations, {counted(len(frame), 'iteration')} launched ({SIMULATED_NOTE})"
    )
    return fig


def _draw_token_rates(ax: Axes, rates: pd.DataFrame, scale: float, unit: str) -> None:
    """Prefill and decode tokens per simulated second (:func:`~simsim.results.token_rates`),
    stacked, one bar per time window."""
    left = rates["window_start_us"].to_numpy(dtype=np.float64) / scale
    width_us = float(rates["window_end_us"].iloc[-1]) / len(rates)
    width = width_us / scale
    prefill_rate = rates["prefill_tokens_per_s"].to_numpy(dtype=np.float64)
    decode_rate = rates["decode_tokens_per_s"].to_numpy(dtype=np.float64)
    ax.bar(
        left,
        prefill_rate,
        width=width,
        align="edge",
        color=_PREFILL_COLOR,
        alpha=0.8,
        label="prefill tokens",
    )
    ax.bar(
        left,
        decode_rate,
        width=width,
        bottom=prefill_rate,
        align="edge",
        color=_DECODE_COLOR,
        alpha=0.6,
        label="decode tokens",
    )
    ax.set_ylabel(f"tokens / s\n(per {width:.3g} {unit} window)")


def draw_replica_load(requests: pd.DataFrame, end_us: int | None = None) -> Figure:
    """Requests on each replica of a cluster over simulated time.

    Per pool (one for a cluster; prefill and decode for a disaggregated one), a heat
    map of replica x time whose colour is the time-weighted mean number of requests on
    the replica in each of :data:`REPLICA_LOAD_WINDOWS` equal windows (see
    :func:`replica_load_series`), readable at 64 replicas and more, under a panel with
    the least, mean and most loaded replica per window: the gap between the lines is
    the imbalance. Drawn up to *end_us* (the run's end) or the table's last time.
    """
    end = max(_horizon_us(requests), end_us or 0)
    scale, unit = _time_unit(end)
    probe = replica_pools(requests, required=True)
    sizes = [max(1, len(indices)) for _, indices in probe]
    ratios = [r for size in sizes for r in (2.0, min(8.0, 1.5 + 0.12 * size))]
    fig, axes = plt.subplots(
        2 * len(probe),
        1,
        figsize=(11, 2.2 + 1.4 * sum(ratios)),
        sharex=True,
        layout="constrained",
        height_ratios=ratios,
        squeeze=False,
    )
    if end <= 0 or len(requests) == 0:
        for ax in axes[:, 0]:
            _no_data(ax, "no requests")
        axes[-1, 0].set_xlabel(f"simulated time ({unit})")
        fig.suptitle(f"Requests per replica ({SIMULATED_NOTE})")
        return fig
    edges, pools = replica_load_series(requests, end)
    x = edges / scale
    centers = (x[:-1] + x[1:]) / 2
    for position, (name, indices, means) in enumerate(pools):
        spread, heat = axes[2 * position, 0], axes[2 * position + 1, 0]
        what = f"{name} replicas" if name else "replicas"
        if len(indices) == 0:
            _no_data(spread, f"no {what}")
            _no_data(heat, f"no {what}")
            continue
        spread.fill_between(
            centers,
            means.min(axis=0),
            means.max(axis=0),
            step="mid",
            color=_DECODE_COLOR,
            alpha=0.25,
            label="least to most loaded replica",
        )
        spread.step(centers, means.max(axis=0), where="mid", color=_DECODE_COLOR, linewidth=1)
        spread.step(centers, means.min(axis=0), where="mid", color=_DECODE_COLOR, linewidth=1)
        spread.step(
            centers, means.mean(axis=0), where="mid", color="black", linewidth=1.2, label="mean"
        )
        spread.set_ylabel(f"requests per\nreplica ({name or 'all'})")
        spread.set_ylim(0, max(1.0, float(means.max())) * 1.15)
        spread.grid(True, alpha=0.3)
        spread.legend(loc="upper right", fontsize="small", ncol=2)
        image = heat.imshow(
            means,
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            vmin=0,
            extent=(0.0, float(x[-1]), indices.stop - 0.5, indices.start - 0.5),
        )
        heat.set_ylabel(f"{name} replica" if name else "replica")
        heat.yaxis.set_major_locator(_WholeNumbers(nbins=min(len(indices), 16)))
        bar = fig.colorbar(image, ax=heat, pad=0.01)
        bar.set_label("requests (mean\nper window)", fontsize="small")
    axes[-1, 0].set_xlim(0, float(x[-1]))
    axes[-1, 0].set_xlabel(
        f"simulated time ({unit}, {end / REPLICA_LOAD_WINDOWS / scale:.3g} {unit} windows)"
    )
    count = sum(len(indices) for _, indices, _ in pools)
    on = "the one replica" if count == 1 else f"each of {counted(count, 'replica')}"
    fig.suptitle(
        f"Requests on {on} over time, {counted(len(requests), 'request')} ({SIMULATED_NOTE})"
    )
    return fig


def draw_gantt(
    requests: pd.DataFrame, end_us: int | None = None, *, measured: bool = False
) -> Figure:
    """One row per request: waiting, prefill and decoding bars; cancellations marked.

    A request unfinished at the end (a served session stopped while it ran) has its
    bars drawn to *end_us*, the run's end, or else to the table's last time, and a
    marker there. *measured* (a ``simsim replay`` folder): a client sees no admission
    or prefill end, so the bars are the time to the first token and the decoding after
    it. A disaggregated cluster's table (``transfer_start_us`` and ``transfer_end_us``)
    adds, over the decoding bar, the wait on the decode replica (from the hand-off at
    the prefill's end to the transfer's start) and the KV transfer itself.
    """
    if measured:
        requests = requests.assign(
            admit_time_us=requests["arrival_time_us"],
            prefill_end_time_us=requests["first_token_time_us"],
        )
    ordered = requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    n = len(ordered)
    horizon = max(_horizon_us(ordered), end_us or 0)
    scale, unit = _time_unit(horizon)
    fig, ax = plt.subplots(figsize=(11, max(3.0, 1.6 + 0.28 * n)), layout="constrained")
    height = 0.7
    cancelled_x: list[float] = []
    cancelled_y: list[int] = []
    failed_x: list[float] = []
    failed_y: list[int] = []
    unfinished_y: list[int] = []
    transfers = not measured and {"transfer_start_us", "transfer_end_us"} <= set(ordered)
    nothing: list[int | None] = [None] * n
    columns = zip(
        ordered["arrival_time_us"].astype("Int64").tolist(),
        _optional_ints(ordered["admit_time_us"]),
        _optional_ints(ordered["prefill_end_time_us"]),
        _optional_ints(ordered["finish_time_us"]),
        ordered["state"].astype(str).tolist(),
        _optional_ints(ordered["transfer_start_us"]) if transfers else nothing,
        _optional_ints(ordered["transfer_end_us"]) if transfers else nothing,
        strict=True,
    )
    for row, (arrival, admit, prefill_end, finish, state, moved, landed) in enumerate(columns):
        stop = horizon if finish is None else finish
        segments: list[tuple[int | None, int | None, str]] = [
            (arrival, admit if admit is not None else stop, _WAIT_COLOR),
            (admit, prefill_end if prefill_end is not None else stop, _PREFILL_COLOR),
            (prefill_end, stop, _DECODE_COLOR),
            # Drawn over the decoding bar: queued on the decode replica, then the transfer.
            (prefill_end, moved, _WAIT_COLOR),
            (moved, landed, _TRANSFER_COLOR),
        ]
        for begin, until, color in segments:
            if begin is None or until is None or until <= begin:
                continue
            ax.broken_barh(
                [(begin / scale, (until - begin) / scale)],
                (row - height / 2, height),
                facecolors=color,
            )
        if state == "FAILED" and finish is not None:  # a replay's failed request
            failed_x.append(finish / scale)
            failed_y.append(row)
        elif state == "CANCELLED" and finish is not None:
            cancelled_x.append(finish / scale)
            cancelled_y.append(row)
        elif finish is None:
            unfinished_y.append(row)
    if cancelled_x:
        ax.scatter(cancelled_x, cancelled_y, marker="x", s=40, color=_CANCEL_COLOR, zorder=3)
    if failed_x:
        ax.scatter(failed_x, failed_y, marker="X", s=60, color="black", zorder=3)
    if unfinished_y:
        ax.scatter(
            [horizon / scale] * len(unfinished_y),
            unfinished_y,
            marker=">",
            s=30,
            color=_CANCEL_COLOR,
            zorder=3,
            clip_on=False,
        )
    ax.set_yticks(range(n), [str(r) for r in ordered["request_id"]])
    ax.tick_params(axis="y", labelsize="small" if n <= 30 else "x-small")
    ax.set_ylim(n - 0.5 if n else 0.5, -0.5)
    ax.set_xlim(0, horizon / scale if horizon > 0 else 1)
    ax.set_xlabel(
        f"time since the replay started ({unit})" if measured else f"simulated time ({unit})"
    )
    ax.set_ylabel("request id")
    ax.grid(True, axis="x", alpha=0.3)
    if n == 0:
        _no_data(ax, "no requests")
    ax.legend(
        handles=[
            *(
                [
                    Patch(color=_PREFILL_COLOR, label="sent to first token"),
                    Patch(color=_DECODE_COLOR, label="first token to the end"),
                ]
                if measured
                else [
                    Patch(
                        color=_WAIT_COLOR,
                        label="waiting for admission (on either replica)"
                        if transfers
                        else "waiting (arrival to admission)",
                    ),
                    Patch(color=_PREFILL_COLOR, label="prefill (admission to prefill end)"),
                    Patch(color=_DECODE_COLOR, label="decoding (prefill end to finish)"),
                    *(
                        [Patch(color=_TRANSFER_COLOR, label="KV transfer to the decode replica")]
                        if transfers
                        else []
                    ),
                ]
            ),
            Line2D([], [], marker="x", linestyle="none", color=_CANCEL_COLOR, label="cancelled"),
            *(
                [Line2D([], [], marker="X", linestyle="none", color="black", label="failed")]
                if measured
                else []
            ),
            Line2D(
                [],
                [],
                marker=">",
                linestyle="none",
                color=_CANCEL_COLOR,
                label="unfinished at the end",
            ),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08 if n > 10 else -0.18),
        ncol=5,
        fontsize="small",
        frameon=False,
    )
    note = MEASURED_NOTE if measured else SIMULATED_NOTE
    ax.set_title(f"Per-request timeline, {counted(n, 'request')} ({note})")
    return fig


# ---------------------------------------------------------------------- driver


@dataclass(frozen=True)
class FigureSpec:
    """One figure :func:`plot_results` may write: its file name and how to draw it.

    ``draw`` returns ``None`` to skip the figure (nothing is written or listed).
    """

    filename: str
    draw: Callable[[RunFolder], Figure | None] = field(repr=False)


def _gantt_if_small(results: RunFolder) -> Figure | None:
    requests = results.requests()
    if len(requests) > GANTT_MAX_REQUESTS:
        return None
    end_us = results.manifest.get("end_us")
    end = end_us if isinstance(end_us, int) else None
    return draw_gantt(requests, end, measured=results.measured)


def _replica_load_if_cluster(results: RunFolder) -> Figure | None:
    requests = results.requests()
    if not replica_pools(requests):
        return None
    end_us = results.manifest.get("end_us")
    return draw_replica_load(requests, end_us if isinstance(end_us, int) else None)


def _class_latency_if_named(by: str) -> Callable[[RunFolder], Figure | None]:
    """The per-class latency figure by *by*, for a folder whose requests name one."""

    def draw(results: RunFolder) -> Figure | None:
        requests = results.requests()
        if by not in requests.columns or not requests[by].notna().any():
            return None
        return draw_class_latency(requests, by, measured=results.measured)

    return draw


FIGURES: Final[Sequence[FigureSpec]] = (
    FigureSpec(
        "latency_cdf.png",
        lambda results: draw_latency_cdf(results.requests(), measured=results.measured),
    ),
    FigureSpec(
        "timeline.png",
        lambda results: draw_timeline(results.requests(), measured=results.measured),
    ),
    FigureSpec("gantt.png", _gantt_if_small),
    FigureSpec(
        "iterations.png",
        lambda results: (
            draw_iterations(results.table("iterations")) if results.has("iterations") else None
        ),
    ),
    FigureSpec("replica_load.png", _replica_load_if_cluster),
    FigureSpec("class_latency.png", _class_latency_if_named("request_class")),
    FigureSpec("tenant_latency.png", _class_latency_if_named("tenant")),
)
"""The figures of :func:`plot_results`, in the order they are written and listed."""


def plot_results(results_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Draw the figures of a ``simsim run`` results folder as PNG files.

    *results_dir* holds ``requests.csv`` or ``requests.parquet`` (and the other
    tables); the PNGs go to *out_dir* (created if needed; default: *results_dir*).
    Returns the paths written, in the order of :data:`FIGURES`: ``latency_cdf.png``,
    ``timeline.png`` and, for at most :data:`GANTT_MAX_REQUESTS` requests,
    ``gantt.png``. Raises ``FileNotFoundError`` naming the folder and the file when a
    needed table is missing.
    """
    results = read_run_folder(results_dir)
    figures = ((spec.filename, functools.partial(spec.draw, results)) for spec in FIGURES)
    return _save_figures(figures, Path(results_dir) if out_dir is None else Path(out_dir))


def _save_figures(
    figures: Iterable[tuple[str, Callable[[], Figure | None]]], target: Path
) -> list[Path]:
    """Draw each (file name, draw) pair into *target*; a draw returning ``None`` is skipped."""
    target.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for filename, draw in figures:
        fig = draw()
        if fig is None:
            continue
        path = target / filename
        try:
            fig.savefig(path, dpi=_DPI)
        finally:
            plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------------- sweeps

_SWEEP_LATENCIES: Final = (
    ("ttft_us", "TTFT"),
    ("tpot_us", "TPOT"),
    ("e2e_latency_us", "end-to-end latency"),
)
_SWEEP_THROUGHPUTS: Final = (
    ("throughput_requests_per_s", "finished requests / s"),
    ("throughput_tokens_per_s", "generated tokens / s"),
    ("goodput_requests_per_s", "goodput (requests meeting the SLOs / s)"),
    ("slo_attainment", "SLO attainment (fraction of requests)"),
)


def _draw_lines(ax: Axes, folder: SweepFolder, metric: str, scale: float) -> bool:
    """Mean and shaded interval of *metric* against load, one line per configuration."""
    drawn = False
    for label, rows in folder.lines(metric):
        x = rows[folder.load].to_numpy(dtype=np.float64)
        mean = rows["mean"].to_numpy(dtype=np.float64) * scale
        if np.all(np.isnan(mean)):
            continue
        (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label or None)
        # Clipped here too: a folder written before summaries were clipped may hold a
        # latency interval below 0 or an attainment interval above 1.
        lowest, highest = metric_range(metric)
        low = np.clip(rows["ci_low"].to_numpy(dtype=np.float64), lowest, highest) * scale
        high = np.clip(rows["ci_high"].to_numpy(dtype=np.float64), lowest, highest) * scale
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if pd.api.types.is_integer_dtype(folder.summary[folder.load]):  # replicas, slots...
        ax.xaxis.set_major_locator(_WholeNumbers())
    ax.grid(True, alpha=0.3)
    return drawn


def draw_sweep_latency(folder: SweepFolder) -> Figure:
    """TTFT, TPOT and e2e percentiles (ms) against load: one panel per metric and percentile."""
    metrics = set(folder.summary["metric"])
    labels = sorted(
        {m.rsplit("_", 1)[1] for m in metrics if m.startswith("ttft_us_p")},
        key=lambda label: float(label[1:]),
    )
    rows, columns = len(_SWEEP_LATENCIES), max(1, len(labels))
    fig, axes = plt.subplots(
        rows, columns, figsize=(4 * columns, 3.2 * rows), squeeze=False, layout="constrained"
    )
    for i, (column, title) in enumerate(_SWEEP_LATENCIES):
        for j, label in enumerate(labels):
            ax = axes[i][j]
            ax.set_title(f"{title} {label}")
            if not _draw_lines(ax, folder, f"{column}_{label}", 1e-3):
                _no_data(ax, "not measured")
            _log_if_wide(ax)
            if j == 0:
                ax.set_ylabel("ms (simulated)")
            if i == rows - 1:
                ax.set_xlabel(folder.load)
    _sweep_legend(fig, axes[0][0])
    fig.suptitle(
        f"Latency percentiles against load: mean over replications, "
        f"{folder.confidence:.0%} interval shaded\n({SIMULATED_NOTE})"
    )
    return fig


def _log_if_wide(ax: Axes) -> None:
    """A log y axis when the lines span more than two decades (a saturated server)."""
    values = np.concatenate([line.get_ydata() for line in ax.get_lines()] or [np.empty(0)])
    values = values[np.isfinite(values)]
    if len(values) and values.min() > 0 and values.max() / values.min() > 100:
        ax.set_yscale("log")


def draw_sweep_throughput(folder: SweepFolder) -> Figure:
    """Throughput (and goodput and SLO attainment, if measured) against load."""
    present = [(m, t) for m, t in _SWEEP_THROUGHPUTS if m in set(folder.summary["metric"])]
    columns = 2 if len(present) > 2 else len(present)
    rows = -(-len(present) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(present) :]:
        ax.set_visible(False)
    for ax, (metric, title) in zip(axes.flat, present, strict=False):
        ax.set_title(title)
        ax.set_xlabel(folder.load)
        if not _draw_lines(ax, folder, metric, 1.0):
            _no_data(ax, "not measured")
    _sweep_legend(fig, axes[0][0])
    fig.suptitle(
        f"Throughput against load: mean over replications, {folder.confidence:.0%} interval "
        f"shaded\n({SIMULATED_NOTE})"
    )
    return fig


def _sweep_legend(fig: Figure, ax: Axes) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(handles)))


PLAN_COLORS: Final = {
    "meets": "#2ca02c",
    "misses": "#ff7f0e",
    "overloaded": "#d62728",
    "does not fit": "0.55",
    "invalid tp": "0.75",
}
"""The colour of each verdict of a capacity plan's table in :func:`draw_plan`."""


def draw_plan(table: pd.DataFrame) -> Figure:
    """What :func:`simsim.sweeps.plan_capacity` tried: one column per (GPU, tp) pair, each
    run a dot at its $/hour coloured by its verdict and labelled with its replica count;
    pairs never run (does not fit, invalid tp) a cross at the bottom; the answer starred."""
    pairs = list(dict.fromkeys(zip(table["gpu"], table["tp"], strict=True)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(pairs) + 2), 4.8), layout="constrained")
    costs = table["usd_per_hour"].dropna()
    floor = float(costs.min()) / 2 if len(costs) else 1.0
    for position, (gpu, tp) in enumerate(pairs):
        rows = table[(table["gpu"] == gpu) & (table["tp"] == tp)]
        for row in rows.to_dict("records"):
            color = PLAN_COLORS.get(row["verdict"], "black")
            if pd.isna(row["replicas"]):
                ax.scatter([position], [floor], marker="x", color=color, s=60)
                continue
            ax.scatter([position], [row["usd_per_hour"]], color=color, s=40, zorder=3)
            ax.annotate(
                f"{row['replicas']}",
                (position, row["usd_per_hour"]),
                xytext=(6, -3),
                textcoords="offset points",
                fontsize=8,
            )
            if row["best"]:
                ax.scatter(
                    [position],
                    [row["usd_per_hour"]],
                    marker="*",
                    s=260,
                    zorder=4,
                    facecolor="none",
                    edgecolor="black",
                )
    ax.set_xticks(range(len(pairs)), [f"{gpu}\ntp={tp}" for gpu, tp in pairs], fontsize=8)
    ax.set_xlim(-0.6, len(pairs) - 0.4)
    if len(costs) and float(costs.max()) > 20 * float(costs.min()):
        ax.set_yscale("log")
    ax.set_ylabel("$ per hour (GPUs x price per GPU-hour)")
    fig.suptitle(f"Configurations tried, labelled with their replicas ({SIMULATED_NOTE})")
    present = [v for v in PLAN_COLORS if v in set(table["verdict"])]
    handles: list[Line2D] = [
        Line2D(
            [],
            [],
            linestyle="",
            color=PLAN_COLORS[v],
            marker="x" if v in ("does not fit", "invalid tp") else "o",
            label=v,
        )
        for v in present
    ]
    if table["best"].any():
        handles.append(
            Line2D(
                [],
                [],
                linestyle="",
                marker="*",
                markersize=12,
                markerfacecolor="none",
                markeredgecolor="black",
                label="cheapest that meets the targets",
            )
        )
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_sweep(results_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Draw a sweep folder's figures: ``sweep_latency.png`` and ``sweep_throughput.png``.

    The x axis is the sweep's load axis (``load``, by default its first rate axis);
    every other axis and the case make the configurations, one line each, with the
    confidence interval of the mean over replications shaded.
    """
    folder = SweepFolder.read(Path(results_dir))
    figures = (
        ("sweep_latency.png", functools.partial(draw_sweep_latency, folder)),
        ("sweep_throughput.png", functools.partial(draw_sweep_throughput, folder)),
    )
    return _save_figures(figures, Path(results_dir) if out_dir is None else Path(out_dir))


# ---------------------------------------------------------------------- helpers


def _present(column: pd.Series[int]) -> npt.NDArray[np.float64]:
    """The column's present values as floats (missing ones dropped)."""
    return np.asarray(column.dropna().to_numpy(dtype=np.float64), dtype=np.float64)


def _optional_ints(column: pd.Series[int]) -> list[int | None]:
    """The column's values as Python ints, with ``None`` for missing ones."""
    values = column.astype("Int64")
    return [None if pd.isna(v) else int(v) for v in values.astype(object).tolist()]


def _horizon_us(requests: pd.DataFrame) -> int:
    """The last time anything in the table happened (0 for an empty table)."""
    latest = 0
    for column in (
        "arrival_time_us",
        "admit_time_us",
        "prefill_end_time_us",
        "first_token_time_us",
        "finish_time_us",
    ):
        values = _present(requests[column])
        if len(values):
            latest = max(latest, int(values.max()))
    return latest


def _time_unit(span_us: int) -> tuple[float, str]:
    """A divisor and unit name that keep *span_us* readable: ms below 10 s, else s."""
    return (1e6, "s") if span_us >= 10_000_000 else (1e3, "ms")


def _fmt_ms(value_ms: float) -> str:
    return f"{value_ms:,.0f} ms" if value_ms >= 100 else f"{value_ms:.2f} ms"


def _no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")
