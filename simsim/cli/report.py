"""A run's and a sweep's figures for a terminal: units, rounding, who each row covers.

Every figure comes from :mod:`simsim.results`; this module only words and aligns it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from simsim.admission import QUEUE_FULL, RATE_LIMITED
from simsim.cluster import Cluster, DisaggregatedCluster
from simsim.gpu.physics import FrontendOverheads
from simsim.gpu.vllm import VllmConfig
from simsim.overload import overload_check
from simsim.request import RequestState
from simsim.results import (
    CLIENT_COLUMNS,
    batch_summary,
    class_summary,
    latency_counts,
    prefix_cache_summary,
    replica_requests,
    server_slots,
    transfer_summary,
)
from simsim.scenario import (
    Scenario,
)
from simsim.sweeps.plan import CapacityPlan
from simsim.sweeps.sweep import SweepResult
from simsim.wording import counted


def overload_line(requests: pd.DataFrame) -> str | None:
    """The line saying that the run was overloaded (:func:`simsim.overload.overload_check`
    over the whole run), or ``None`` when it was not."""
    verdict = overload_check(requests)
    if not verdict.overloaded:
        return None
    return (
        f"overloaded: the queue grew from {verdict.queue_start:,} to {verdict.queue_end:,} "
        f"waiting requests while requests arrived; arrivals "
        f"{verdict.arrival_rate_per_s:.2f}/s, completions {verdict.completion_rate_per_s:.2f}/s "
        "- latencies are not steady-state"
    )


# Each latency row of the run table: its column, its label, whom it covers (the rows
# where the value exists: one such request, several) and why it can be missing.
_LatencyRow = tuple[str, str, tuple[str, str], str]
_LATENCY_ROWS: tuple[_LatencyRow, ...] = (
    (
        "queue_delay_us",
        "queue delay",
        ("admitted request", "admitted requests"),
        "no request was admitted",
    ),
    (
        "ttft_us",
        "TTFT",
        ("request that produced a token", "requests that produced a token"),
        "no request produced a token",
    ),
    (
        "e2e_latency_us",
        "e2e latency",
        ("finished request", "finished requests"),
        "no request finished",
    ),
    (
        "tpot_us",
        "TPOT",
        ("finished request with 2+ tokens", "finished requests with 2+ tokens"),
        "no finished request produced 2+ tokens",
    ),
)


# A vLLM server's latencies as its clients see them (Scenario.requests_frame).
_CLIENT_ROWS: tuple[_LatencyRow, ...] = tuple(
    (column, label, ("finished request", "finished requests"), "no request finished")
    for column, label in zip(CLIENT_COLUMNS, ("client TTFT", "client e2e"), strict=True)
)

_GIB = 2**30


def vllm_lines(config: VllmConfig) -> list[str]:
    """What a vLLM scenario built, for a terminal: the model on its GPUs, the weights per
    GPU, the KV cache per replica (:meth:`~simsim.gpu.vllm.VllmConfig.memory`) and the
    serving limits."""
    plan = config.memory()
    model = config.model
    weights = "FP8" if model.weight_bytes_per_param <= 1 else "16-bit"
    kv = "FP8" if model.kv_bytes_per_element <= 1 else "16-bit"
    caching = "on" if config.enable_prefix_caching else "off"
    return [
        f"vllm          {model.name} on {config.gpu.name} x {config.tp} (tp={config.tp}): "
        f"{plan.weight_bytes / _GIB:.1f} GiB of {weights} weights per GPU",
        f"vllm memory   {plan.kv_blocks:,} KV blocks x {plan.block_size} tokens = "
        f"{plan.kv_tokens:,} tokens of {kv} KV cache per replica (gpu_mem_util "
        f"{config.gpu_mem_util:g})",
        f"vllm limits   max_num_seqs {config.max_num_seqs:,}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens:,}, prefix caching {caching}",
    ]


def frontend_lines(overheads: FrontendOverheads) -> list[str]:
    """What the client rows of :func:`summary_table` add to the engine's latencies."""
    return [
        "client rows   include vLLM's frontend overheads (the rows above them are the engine's):",
        f"{'':14}{duration(overheads.before_queue_us)} before queueing, "
        f"{duration(overheads.per_output_token_us)} per output token, "
        f"{duration(overheads.at_completion_us)} at completion",
    ]


_DECODE_QUEUE_ROW: _LatencyRow = (
    "decode_queue_delay_us",
    "decode queue",
    ("request admitted on a decode replica", "requests admitted on a decode replica"),
    "no request was admitted on a decode replica",
)


def batching_lines(
    kv_blocks: int | dict[int, int] | None,
    prefix_cache: bool,
    iterations: pd.DataFrame,
    events: pd.DataFrame,
    requests: pd.DataFrame,
) -> list[str]:
    """The batching servers' load for a terminal: batch size, preemptions, KV memory
    (:func:`~simsim.results.batch_summary` with *kv_blocks*, from
    :func:`~simsim.results.server_kv_blocks`) and, with a *prefix_cache*, its hits.

    Means are over simulated time (each iteration weighs as long as it lasted), so an
    idle stretch between iterations does not count. For a cluster (frames with a
    ``replica`` column) they are over every replica's iterations, and KV memory is each
    replica's share of its own cache.
    """
    load = batch_summary(iterations, events, kv_blocks=kv_blocks)
    head = f"batching      {counted(int(load['iterations']), 'iteration')}"
    preempted = counted(int(load["preemptions"]), "preemption")
    if pd.isna(load["mean_batch_size"]):
        return [f"{head}, {preempted}"]
    batch = load["mean_batch_size"]
    lines = [f"{head}, {batch:.2f} requests per batch on average, {preempted}"]
    if kv_blocks is not None:
        used, peak = load["kv_cache_use_mean"], load["kv_cache_use_peak"]
        total = int(load["kv_cache_blocks"])
        if isinstance(kv_blocks, int):
            lines.append(
                f"KV cache      {used:.1%} of {counted(total, 'block')} "
                f"in use on average, {peak:.1%} at the peak"
            )
        else:
            lines.append(
                f"KV cache      {used:.1%} of a replica's blocks in use on average, "
                f"{peak:.1%} at the peak ({counted(total, 'block')} in all)"
            )
    if prefix_cache:
        cache = prefix_cache_summary(requests)
        share = (
            "n/a (no prompt tokens)"
            if pd.isna(cache["hit_rate_tokens"])
            else f"{cache['hit_rate_tokens']:.1%}"
        )
        lines.append(
            f"prefix cache  {share} of prompt tokens served from the cache; "
            f"{int(cache['hit_requests'])} of {counted(len(requests), 'request')} hit it"
        )
    return lines


_REPLICA_LINES = 16
"""A cluster with more replicas prints their spread, not one line each."""


def cluster_lines(
    cluster: Cluster, scenario: Scenario, requests: pd.DataFrame, summary: pd.Series
) -> list[str]:
    """Per replica: requests routed and finished (handed to decode, on a prefill replica);
    per pool: the spread of the replicas' utilisation."""
    assert scenario.cluster is not None
    lines = [f"cluster       {scenario.cluster.describe()}"]
    disaggregated = isinstance(cluster, DisaggregatedCluster)
    _, counts = server_slots(cluster)
    rows: list[tuple[str, int, str, int]] = []
    for row in replica_requests(requests, replicas=counts).to_dict("records"):
        if row["pool"] == "prefill":
            rows.append(("prefill ", row["routed"], "handed to decode", row["handed_off"]))
        else:
            role = "decode " if disaggregated else ""
            rows.append((role, row["routed"], "finished", row["finished"]))
    if len(rows) <= _REPLICA_LINES:
        lines.extend(
            f"{f'replica {i}':<14}{role}{routed} routed, {done} {what}"
            for i, (role, routed, what, done) in enumerate(rows)
        )
    else:
        lines.extend(_replica_spread(rows))
    pools = ("prefill_", "decode_") if disaggregated else ("",)
    for pool in pools:
        low = summary.get(f"{pool}replica_utilization_min")
        high = summary.get(f"{pool}replica_utilization_max")
        imbalance = summary.get(f"{pool}replica_load_imbalance")
        if low is None or high is None or pd.isna(low) or pd.isna(high):
            continue
        who = pool.replace("_", " ")
        if summary.get(f"{pool}replicas") == 1:  # nothing to balance: how busy it was
            lines.append(f"{'balance':<14}{who}replica busy {low:.1%} of the time (the only one)")
            continue
        lines.append(
            f"{'balance':<14}{who}replicas busy {low:.1%} to {high:.1%} "
            f"of the time; busiest got {imbalance:.2f}x its fair share of requests"
        )
    moved = transfer_summary(requests)
    if moved["transfers"]:
        lines.append(
            f"KV transfer   {counted(int(moved['transfers']), 'transfer')}, "
            f"mean {duration(moved['transfer_us_mean'])}, "
            f"max {duration(moved['transfer_us_max'])}"
        )
    return lines


def _replica_spread(rows: Sequence[tuple[str, int, str, int]]) -> list[str]:
    """One line per pool: the fewest and most requests a replica was routed and finished."""
    lines = []
    for role in dict.fromkeys(row[0] for row in rows):
        pool = [row for row in rows if row[0] == role]
        routed = [row[1] for row in pool]
        done = [row[3] for row in pool]
        lines.append(
            f"{'per replica':<14}{role}{min(routed)} to {max(routed)} routed, "
            f"{min(done)} to {max(done)} {pool[0][2]} ({counted(len(pool), 'replica')})"
        )
    return lines


def summary_table(summary: pd.DataFrame, requests: pd.DataFrame, server: Sequence[str] = ()) -> str:
    """The run's summary for a terminal: no NaN, every time in ms or s, who each row covers."""
    values = summary["value"]
    lines = [f"requests      {values['requests']:.0f}{_request_counts(values)}"]
    makespan = values["makespan_us"]
    if pd.isna(makespan):
        lines.append("makespan      n/a (no request finished or was cancelled)")
    else:
        lines.append(f"makespan      {duration(makespan)} (first arrival to last end)")
    if pd.isna(values["throughput_requests_per_s"]):
        why = "no makespan" if pd.isna(makespan) else f"the makespan is {duration(makespan)}"
        lines.append(f"throughput    n/a ({why})")
    else:
        lines.append(
            f"throughput    {values['throughput_requests_per_s']:.2f} requests/s, "
            f"{values['throughput_tokens_per_s']:.1f} tokens/s"
        )
    lines.extend(_occupancy_lines(values))
    lines.extend(server)
    stats = ("mean", "p50", "p90", "p99")
    lines.append(f"{'':14}{''.join(f'{stat:>12}' for stat in stats)}   over")
    latency_rows = _LATENCY_ROWS
    if "decode_queue_delay_us" in requests.columns:  # disaggregated: a queue per pool
        queue, *others = _LATENCY_ROWS
        latency_rows = (("queue_delay_us", "prefill queue", *queue[2:]), _DECODE_QUEUE_ROW, *others)
    latency_rows += tuple(row for row in _CLIENT_ROWS if row[0] in requests.columns)
    covered = latency_counts(requests)
    for column, label, covers, why_missing in latency_rows:
        present = int(covered.get(column, requests[column].notna().sum()))
        if present == 0:
            lines.append(f"{label:<14}n/a ({why_missing})")
            continue
        cells = "".join(f"{duration(values[f'{column}_{stat}']):>12}" for stat in stats)
        lines.append(f"{label:<14}{cells}   {counted(present, *covers)}")
    return "\n".join(lines)


# How the requests line says why an admission control rejected a request.
_REJECTIONS = {RATE_LIMITED: "rate-limited", QUEUE_FULL: "with the queue full"}


def _request_counts(values: pd.Series) -> str:
    """The requests by state, in words: ``" (finished 90, cancelled 10, of which 6
    rejected: 4 rate-limited, 2 with the queue full)"``; states no request ended in are
    left out, and so is the rejection part without an admission control or a rejection
    (a rejected request ends cancelled, so it is told as a part of the cancelled)."""
    states = []
    for name in values.index:
        state = name.removeprefix("count_")
        if name == state or not state.isupper() or values[name] <= 0:
            continue
        words = f"{state.lower()} {values[name]:.0f}"
        if state == RequestState.CANCELLED.name and values.get("count_rejected", 0) > 0:
            reasons = [
                f"{values[f'count_rejected_{reason}']:.0f} {said}"
                for reason, said in _REJECTIONS.items()
                if values[f"count_rejected_{reason}"] > 0
            ]
            words += f", of which {values['count_rejected']:.0f} rejected: {', '.join(reasons)}"
        states.append(words)
    return f" ({', '.join(states)})" if states else ""


def _occupancy_lines(values: pd.Series) -> list[str]:
    """The occupancy rows of the summary (if it has them) for a terminal: the whole
    server's or cluster's, or, for a disaggregated cluster, one line per pool."""
    pools = [p for p in ("prefill_", "decode_") if f"{p}utilization" in values.index] or [""]
    if f"{pools[0]}utilization" not in values.index:
        return []
    lines = []
    for pool in pools:
        label = f"occupancy     {pool.replace('_', ' ')}"
        if pd.isna(values[f"{pool}utilization"]):
            lines.append(f"{label}n/a (no makespan)")
        else:
            lines.append(
                f"{label}{values[f'{pool}utilization']:.1%} of slot time busy, "
                f"{values[f'{pool}mean_active_requests']:.2f} requests in slots and "
                f"{values[f'{pool}mean_queue_length']:.2f} queued on average"
            )
    return lines


def class_lines(
    requests: pd.DataFrame, targets: Mapping[str, tuple[float | None, float | None]]
) -> list[str]:
    """One line per request class (or, with no classes, per tenant), from
    :func:`~simsim.results.class_summary`: its requests (and how many an admission
    control rejected), TTFT percentiles, p99 end-to-end latency, and the share of its
    requests that finished within its own SLO targets (*targets*: class -> (TTFT, TPOT)
    in us; rejected and cancelled requests count as missed). Nothing when the requests
    have neither."""
    by = next(
        (
            name
            for name in ("request_class", "tenant")
            if name in requests.columns and requests[name].notna().any()
        ),
        None,
    )
    if by is None:
        return []
    table = class_summary(requests, by, slo=targets if by == "request_class" else None)
    rejections = "rejection" in requests.columns  # an admission control ran
    width = max(14, *(len(str(name)) + 2 for name in table.columns))
    noun = "class" if by == "request_class" else "tenant"
    rejected_head = f"{'rejected':>10}" if rejections else ""
    head = f"{'per ' + noun:<{width}}{'requests':>9}{rejected_head}"
    lines = [f"{head}{'p50 TTFT':>12}{'p99 TTFT':>12}{'p99 e2e':>12}   SLO attained"]
    for name in table.columns:
        values = table[name]
        rejected = ""
        if rejections:
            rejected = f"{int(values['count_rejected']):>10}"
        cells = "".join(
            f"{'n/a' if pd.isna(values[key]) else duration(values[key]):>12}"
            for key in ("ttft_us_p50", "ttft_us_p99", "e2e_latency_us_p99")
        )
        ttft_slo, tpot_slo = (
            targets.get(name, (None, None)) if by == "request_class" else (None, None)
        )
        goals = [
            f"{label} {duration(target)}"
            for label, target in (("TTFT", ttft_slo), ("TPOT", tpot_slo))
            if target is not None
        ]
        attained = (
            f"{values['slo_attainment']:.1%} (within {', '.join(goals)})"
            if goals
            else "n/a (no target)"
        )
        lines.append(f"{name:<{width}}{values['requests']:>9.0f}{rejected}{cells}   {attained}")
    return lines


def duration(value_us: float) -> str:
    """A simulated duration for people: ms below 10 s, s above; never scientific notation."""
    ms = float(value_us) / 1000
    if abs(ms) >= 10_000:
        return f"{ms / 1000:,.1f} s"
    if ms == 0 or abs(ms) >= 1:
        return f"{ms:.1f} ms"
    return f"{ms:.3f} ms"


def sweep_report(result: SweepResult, capacity: pd.DataFrame | None) -> str:
    """A short text report: capacity per configuration, or key metrics per point."""
    if capacity is not None:
        lines = []
        for row in capacity.to_dict("records"):
            low, high, value = (number(row[k]) for k in ("interval_low", "interval_high", "value"))
            lines.append(
                f"{row['configuration']}: {row['find']} {row['parameter']} = "
                f"{'none in range' if value == '-' else value} "
                f"({row['status']}; capacity within [{low}, {high}], {row['runs']} runs)"
            )
        return "\n".join(lines)
    keys = [c for c in ("case", *result.axes) if c in result.runs.columns]
    summary = result.summary
    points = summary.drop_duplicates(subset="point")[["point", *keys]]
    shown = pd.DataFrame(index=pd.MultiIndex.from_frame(points))
    for metric, (title, show) in _SWEEP_COLUMNS.items():
        means = summary[summary["metric"] == metric].set_index("point")["mean"]
        if len(means):
            shown[title] = [
                "n/a" if pd.isna(value) else show(value) for value in points["point"].map(means)
            ]
    overloaded = summary[summary["metric"] == "overloaded"].set_index("point")["mean"]
    if len(overloaded) and (overloaded > 0).any():
        # Shown only when some point was: the share of its runs that were overloaded.
        shown["overloaded"] = [_share_overloaded(v) for v in points["point"].map(overloaded)]
    note = ""
    if (shown == "n/a").any().any():
        note = "\nn/a: no run of that point had the metric (no request produced a token, say)"
    return (
        f"{counted(result.runs['point'].nunique(), 'point')} x "
        f"{counted(result.replications, 'replication')} "
        f"(means over replications):\n{shown.to_string()}{note}"
    )


def _share_overloaded(share: float) -> str:
    """The sweep report's ``overloaded`` cell for a point: yes, no, or the share of runs."""
    if pd.isna(share):
        return "n/a"
    if share in (0.0, 1.0):
        return "yes" if share else "no"
    return f"{share:.0%} of runs"


# The sweep report's metric columns: title and how a value is shown.
_SWEEP_COLUMNS: dict[str, tuple[str, Callable[[float], str]]] = {
    "ttft_us_p99": ("TTFT p99", duration),
    "e2e_latency_us_p99": ("e2e latency p99", duration),
    "throughput_tokens_per_s": ("tokens/s", lambda v: f"{v:,.1f}"),
}


def plan_report(plan: CapacityPlan) -> str:
    """What ``simsim plan`` tried, why each configuration failed, and the answer."""
    shown = pd.DataFrame(
        {
            "gpu": plan.table["gpu"],
            "tp": plan.table["tp"],
            "replicas": [number(v) for v in plan.table["replicas"]],
            "GPUs": [number(v) for v in plan.table["gpus"]],
            "$/hour": ["-" if pd.isna(v) else f"{v:,.2f}" for v in plan.table["usd_per_hour"]],
        }
    )
    for metric in plan.targets:
        shown[metric.removesuffix("_ms")] = [
            "-" if pd.isna(v) else duration(1000 * v) for v in plan.table[metric]
        ]
    shown["verdict"] = [
        f"{verdict} *" if best else verdict
        for verdict, best in zip(plan.table["verdict"], plan.table["best"], strict=True)
    ]
    targets = ", ".join(
        f"{name.removesuffix('_ms')} <= {duration(1000 * limit)}"
        for name, limit in plan.targets.items()
    )
    # The reasons go last, left-aligned: they are sentences, not figures.
    rows = shown.to_string(index=False).splitlines()
    reasons = ["reason", *plan.table["reason"]]
    lines = [
        f"targets: {targets}",
        *(f"{row}  {why}".rstrip() for row, why in zip(rows, reasons, strict=True)),
    ]
    if plan.best is None:
        lines.append(
            f"no configuration met the targets with at most {counted(plan.max_replicas, 'replica')}"
        )
    else:
        lines.append(f"cheapest (*): {plan.best}")
    return "\n".join(lines)


def number(value: Any) -> str:
    """A number for a report (``:g``, but never in scientific notation), ``-`` if missing."""
    if value is None or pd.isna(value):
        return "-"
    text = f"{value:g}"
    return np.format_float_positional(value, trim="-") if "e" in text else text
