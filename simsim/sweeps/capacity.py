"""Capacity search: the highest load (or fewest slots) that still meets latency targets.

The answer comes from bisection over one scenario setting, with every probed value run
several times. A value *meets* the targets when, for every target, the upper end of the
Student-t confidence interval of the metric's mean over the replications is at or
below the target; it *misses* when some target's lower end is above it (or a metric
could not be measured); otherwise it is *uncertain*, and more replications are run (up
to ``max_replications``). A value still uncertain after that is treated as a miss, so
the reported capacity is one the targets are met at with confidence. Bisection assumes
that the metrics get worse as load grows (or as slots shrink).
"""

from __future__ import annotations

import concurrent.futures
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from simsim.checks import check_real, did_you_mean
from simsim.results import CLIENT_COLUMNS, DEFAULT_PERCENTILES, percentile_label
from simsim.sweeps.grid import Case, SweepPoint, expand_grid
from simsim.sweeps.runner import (
    Model,
    Runner,
    RunOptions,
    RunRecord,
    ScenarioSource,
    resolve_source,
)
from simsim.sweeps.stats import mean_interval, metric_range
from simsim.sweeps.sweep import check_confidence, check_replications, runs_frame

__all__ = ["OCCUPANCY_TARGETS", "CapacityResult", "Verdict", "capacity_search"]

Verdict = Literal["meets", "misses", "uncertain"]
Number = int | float

_STEP_LIMIT = 200


@dataclass(frozen=True)
class CapacityResult:
    """What :func:`capacity_search` found.

    ``value`` is the best probed value that meets the targets (the highest for
    ``find="max"``, the lowest for ``find="min"``), or ``None`` if no value in the range
    does. The capacity lies in ``interval`` = (``low``, ``high``): one end meets the
    targets, the other does not; ``None`` stands for "beyond the searched range".
    ``status`` is ``"found"``, ``"all_meet"`` (even the hardest end of the range meets
    the targets) or ``"none_meet"`` (even the easiest end misses them).
    ``evaluations`` has one row per probed value, in probing order: the value, the
    replications run, the verdict, and each target's mean and interval. ``runs`` is the
    tidy table of every run, as :func:`simsim.sweep` returns it.
    """

    parameter: str
    find: Literal["max", "min"]
    value: Number | None
    interval: tuple[Number | None, Number | None]
    status: Literal["found", "all_meet", "none_meet"]
    targets: Mapping[str, float]
    confidence: float
    evaluations: pd.DataFrame
    runs: pd.DataFrame


OCCUPANCY_TARGETS = (
    "utilization",
    "mean_active_requests",
    "mean_queue_length",
    *(
        f"{pool}_{name}"
        for pool in ("prefill", "decode")
        for name in ("utilization", "mean_active_requests", "mean_queue_length")
    ),
)
"""The occupancy metrics a capacity search can target (an upper limit, as for
latencies): a scenario's runs report them from its server's slots; a disaggregated
cluster's also per pool (``prefill_``, ``decode_``)."""


_TARGET_COLUMNS = (
    "queue_delay_us",
    "ttft_us",
    "e2e_latency_us",
    "tpot_us",
    *CLIENT_COLUMNS,
)


def target_metrics(targets: Mapping[str, float]) -> tuple[dict[str, float], list[float]]:
    """Check *targets* (metric -> upper limit) and list the percentiles they need.

    A target names a metric of :func:`simsim.summarize`, e.g. ``ttft_us_p99``,
    ``tpot_us_p90``, ``e2e_latency_us_p50`` or ``queue_delay_us_mean``, or of a vLLM
    server's client latencies, ``client_ttft_us_p99`` or ``client_e2e_us_p90``; a percentile
    that is not reported by default (``ttft_us_p95``) is added to the runs' summaries.
    It may also name an occupancy metric (:data:`OCCUPANCY_TARGETS`), which every run
    of a scenario reports (:func:`simsim.results.run_summary`).
    """
    if not isinstance(targets, Mapping) or not targets:
        raise ValueError(
            "targets must be a non-empty mapping of metric name to upper limit, e.g. "
            "{'ttft_us_p99': 2_000_000}"
        )
    checked: dict[str, float] = {}
    percentiles = list(DEFAULT_PERCENTILES)
    for name, limit in targets.items():
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
        ):
            raise ValueError(f"targets[{name!r}] must be a finite number, got {limit!r}")
        if str(name) in OCCUPANCY_TARGETS:
            checked[str(name)] = float(limit)
            continue
        column, _, statistic = str(name).rpartition("_")
        if column not in _TARGET_COLUMNS or not (statistic == "mean" or is_percentile(statistic)):
            examples = [
                *OCCUPANCY_TARGETS,
                *(f"{c}_{t}" for c in _TARGET_COLUMNS for t in ("mean", "p50", "p90", "p99")),
            ]
            raise ValueError(
                f"targets: unknown metric {name!r}{did_you_mean(str(name), examples)}; "
                "use <column>_<statistic> with column one "
                f"of {', '.join(_TARGET_COLUMNS)} and statistic 'mean' "
                "or a percentile such as 'p99', or an occupancy metric: "
                f"{', '.join(OCCUPANCY_TARGETS)}"
            )
        if statistic != "mean":
            quantile = float(statistic[1:])
            if percentile_label(quantile) not in {percentile_label(q) for q in percentiles}:
                percentiles.append(quantile)
            if percentile_label(quantile) != statistic:
                raise ValueError(
                    f"targets: write the percentile of {name!r} as "
                    f"{column}_{percentile_label(quantile)}"
                )
        checked[str(name)] = float(limit)
    return checked, percentiles


def is_percentile(statistic: str) -> bool:
    """Whether *statistic* names a percentile strictly between 0 and 100: ``p99``, ``p99.9``."""
    if not statistic.startswith("p"):
        return False
    try:
        value = float(statistic[1:])
    except ValueError:
        return False
    return 0 < value < 100


def _check_bounds(low: object, high: object) -> tuple[Number, Number, bool]:
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    assert isinstance(low, int | float) and isinstance(high, int | float)
    if not low < high:
        raise ValueError(f"low must be below high, got low={low!r}, high={high!r}")
    integer = isinstance(low, int) and isinstance(high, int)
    return low, high, integer


class _Search:
    """One bisection, with its memory of what was run at which value."""

    def __init__(
        self,
        runner: Runner,
        parameter: str,
        case: Case | None,
        targets: Mapping[str, float],
        replications: int,
        max_replications: int,
        confidence: float,
    ) -> None:
        self.runner = runner
        self.parameter = parameter
        self.case = case
        self.targets = targets
        self.replications = replications
        self.max_replications = max_replications
        self.confidence = confidence
        self.records: dict[tuple[str, int], RunRecord] = {}
        self.rows: list[dict[str, Any]] = []
        self.points: dict[Number, SweepPoint] = {}
        self.estimate = 0  # runs expected but not yet asked for (for progress)

    def expect(self, probes: int) -> None:
        """Tell progress about the runs *probes* probed values will take, at least."""
        self.estimate = probes * self.replications
        self.runner.expect(self.estimate, open_ended=True)

    def point(self, value: Number) -> SweepPoint:
        if value not in self.points:
            (point,) = expand_grid(
                {self.parameter: [value]}, None if self.case is None else [self.case]
            )
            point = replace(point, index=len(self.points))
            self.runner.source.check(point)
            self.points[value] = point
        return self.points[value]

    def run(self, values: Sequence[Number], count: int) -> None:
        pairs = [
            (self.point(v), r)
            for v in values
            for r in range(count)
            if (self.point(v).key, r) not in self.records
        ]
        self.runner.expect(max(0, len(pairs) - self.estimate))
        self.estimate = max(0, self.estimate - len(pairs))
        for record in self.runner.run(pairs):
            self.records[record.point.key, record.replication] = record

    def verdict(self, value: Number, count: int) -> tuple[Verdict, dict[str, Any]]:
        key = self.point(value).key
        row: dict[str, Any] = {"value": value, "replications": count}
        meets = True
        misses = False
        for metric, limit in self.targets.items():
            values = [self._metric(self.records[key, r], metric) for r in range(count)]
            interval = mean_interval(values, self.confidence, bounds=metric_range(metric))
            row[f"{metric}_mean"] = interval.mean
            row[f"{metric}_ci_low"] = interval.low
            row[f"{metric}_ci_high"] = interval.high
            # A run that could not measure the metric (no finished request) misses it.
            if interval.count < count or interval.low > limit:
                misses = True
            if not interval.high <= limit:
                meets = False
        verdict: Verdict = "misses" if misses else ("meets" if meets else "uncertain")
        row["verdict"] = verdict
        return verdict, row

    @staticmethod
    def _metric(record: RunRecord, metric: str) -> float:
        """*record*'s value of the target *metric*; a run that does not report it at all
        (a model's, for an occupancy target) cannot be judged."""
        if metric not in record.metrics:
            raise ValueError(
                f"targets: the runs report no {metric!r}; occupancy metrics come from a "
                "scenario's server (a model's requests frame says nothing of its slots)"
            )
        return record.metrics[metric]

    def judge(self, values: Sequence[Number]) -> list[bool]:
        """Whether each value surely meets the targets, adding replications if unsure."""
        count = self.replications
        undecided = list(values)
        outcome: dict[Number, tuple[Verdict, dict[str, Any]]] = {}
        while undecided:
            self.run(undecided, count)
            still = []
            for value in undecided:
                outcome[value] = self.verdict(value, count)
                if outcome[value][0] == "uncertain" and count < self.max_replications:
                    still.append(value)
            undecided = still
            count = min(2 * count, self.max_replications)
        for value in values:
            self.rows.append(outcome[value][1])
        return [outcome[value][0] == "meets" for value in values]


def capacity_search(
    scenario: str | os.PathLike[str] | Mapping[str, Any] | Model,
    parameter: str,
    *,
    low: Number,
    high: Number,
    targets: Mapping[str, float],
    find: Literal["max", "min"] = "max",
    tolerance: Number | None = None,
    replications: int = 5,
    max_replications: int | None = None,
    confidence: float = 0.95,
    settings: Mapping[str, Any] | None = None,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
    workers: int | None = None,
    ttft_slo_us: int | None = None,
    tpot_slo_us: float | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CapacityResult:
    """Find the highest *parameter* value in [*low*, *high*] that meets *targets*.

    *parameter* is a dotted scenario key (``"workload.rate_per_s"``); with
    ``find="min"`` the search looks for the lowest value instead, as for the fewest
    ``"batching.max_active_requests"`` that meet the targets. *targets* maps metrics of
    :func:`simsim.summarize` (``ttft_us_p99``, ``tpot_us_p90``, ``e2e_latency_us_p99``,
    any percentile such as ``ttft_us_p95``) to upper limits in microseconds, or an
    occupancy metric (:data:`OCCUPANCY_TARGETS`, ``utilization`` say) to its upper
    limit. Integer
    bounds give an integer search that stops at adjacent values; float bounds stop when
    the interval is at most *tolerance* wide (default: a hundredth of the range).

    Each probed value runs *replications* seeded runs, more when the verdict is
    uncertain (up to *max_replications*, default four times as many); see the module
    docstring for the rule. Seeds follow :func:`simsim.sweep`'s rule, so without
    *settings* a probed value gets the same runs as the same value in a sweep over
    *parameter* with the same seed (and, with the same *out* folder, reuses them).
    *settings* are fixed dotted-key settings applied first (a case named "settings").
    *executor*, *workers*, *out* and *progress* work as in :func:`simsim.sweep`.
    """
    if find not in ("max", "min"):
        raise ValueError(f"find must be 'max' or 'min', got {find!r}")
    low, high, integer = _check_bounds(low, high)
    replications = check_replications(replications)
    if replications < 2:
        raise ValueError(
            f"replications must be at least 2 for a confidence interval, got {replications}"
        )
    if max_replications is None:
        max_replications = 4 * replications
    max_replications = check_replications(max_replications, "max_replications")
    if max_replications < replications:
        raise ValueError(
            f"max_replications ({max_replications}) must be at least replications ({replications})"
        )
    confidence = check_confidence(confidence)
    tolerance = check_tolerance(tolerance, low, high, integer)
    checked_targets, percentiles = target_metrics(targets)
    bounds = SearchBounds(parameter, low, high, integer, tolerance, find)
    searches = run_searches(
        resolve_source(scenario),
        bounds,
        [Case("settings", dict(settings)) if settings else None],
        targets=checked_targets,
        replications=replications,
        max_replications=max_replications,
        confidence=confidence,
        options=RunOptions(
            seed, executor, workers, ttft_slo_us, tpot_slo_us, percentiles, out, progress
        ),
    )
    return searches.results[0]


@dataclass(frozen=True)
class SearchBounds:
    """What one bisection searches: a parameter, its range and its stopping width."""

    parameter: str
    low: Number
    high: Number
    integer: bool
    tolerance: Number
    find: Literal["max", "min"]


@dataclass(frozen=True)
class Searches:
    """The outcome of :func:`run_searches`: one result per configuration, every run."""

    results: list[CapacityResult]
    #: Every run, in probing order, the probed values numbered as points across searches.
    records: list[RunRecord]
    folder: Path | None
    reused: int


def run_searches(
    source: ScenarioSource,
    bounds: SearchBounds,
    configurations: Sequence[Case | None],
    *,
    targets: Mapping[str, float],
    replications: int,
    max_replications: int,
    confidence: float,
    options: RunOptions,
) -> Searches:
    """One capacity search per configuration, on one :class:`Runner` (and folder).

    The one implementation behind :func:`capacity_search` (one configuration: its
    *settings*, or none) and a sweep file's ``[capacity]`` table (one per case and grid
    point). Arguments are already checked.
    """
    results: list[CapacityResult] = []
    records: list[RunRecord] = []
    with Runner(source, options) as runner:
        for configuration in configurations:
            found, runs = search(
                runner,
                bounds,
                case=configuration,
                targets=targets,
                replications=replications,
                max_replications=max_replications,
                confidence=confidence,
            )
            results.append(found)
            # Number the points across searches so each probed value has its own.
            offset = len(points_of(records))
            records.extend(
                replace(r, point=replace(r.point, index=r.point.index + offset)) for r in runs
            )
        runner.finish()
    return Searches(results, records, runner.folder, runner.loaded)


def points_of(records: Sequence[RunRecord]) -> list[SweepPoint]:
    """The distinct points of *records*, in first-seen order."""
    return list({r.point.key: r.point for r in records}.values())


def capacity_frame(results: Sequence[CapacityResult], labels: Sequence[str]) -> pd.DataFrame:
    """One row per configuration: what each capacity search found."""
    rows = []
    for label, result in zip(labels, results, strict=True):
        low, high = result.interval
        rows.append(
            {
                "configuration": label,
                "parameter": result.parameter,
                "find": result.find,
                "status": result.status,
                "value": result.value,
                "interval_low": low,
                "interval_high": high,
                "probes": len(result.evaluations),
                "runs": len(result.runs),
            }
        )
    return pd.DataFrame(rows)


def check_tolerance(tolerance: object, low: Number, high: Number, integer: bool) -> Number:
    if tolerance is None:
        return 1 if integer else (high - low) / 100
    checked = check_real(tolerance, "tolerance", positive=True, keep_int=True)
    return max(checked, 1) if integer else checked


def search(
    runner: Runner,
    bounds: SearchBounds,
    *,
    case: Case | None,
    targets: Mapping[str, float],
    replications: int,
    max_replications: int,
    confidence: float,
) -> tuple[CapacityResult, list[RunRecord]]:
    """Bisection with an open :class:`Runner` (shared by the searches of one sweep file).

    *bounds* says what is searched: the parameter, its range, whether it is an integer,
    the stopping width and which end is sought. Returns the result and the records of
    every run it used, in probing order.
    """
    parameter, low, high = bounds.parameter, bounds.low, bounds.high
    tolerance, integer, find = bounds.tolerance, bounds.integer, bounds.find
    state = _Search(runner, parameter, case, targets, replications, max_replications, confidence)
    state.expect(2 + max(0, math.ceil(math.log2(max(1.0, abs(high - low) / tolerance)))))
    # "easy" is the end of the range where targets are easiest to meet.
    easy, hard = (low, high) if find == "max" else (high, low)
    easy_meets, hard_meets = state.judge([easy, hard])
    status: Literal["found", "all_meet", "none_meet"]
    if not easy_meets:
        status, value, met, missed = "none_meet", None, None, easy
    elif hard_meets:
        status, value, met, missed = "all_meet", hard, hard, None
    else:
        met, missed = easy, hard
        for _ in range(_STEP_LIMIT):
            if abs(missed - met) <= tolerance:
                break
            middle = (met + missed) // 2 if integer else (met + missed) / 2
            if middle in (met, missed):
                break
            (meets,) = state.judge([middle])
            if meets:
                met = middle
            else:
                missed = middle
        status, value = "found", met
    interval = (met, missed) if find == "max" else (missed, met)
    records = list(state.records.values())
    result = CapacityResult(
        parameter=parameter,
        find=find,
        value=value,
        interval=interval,
        status=status,
        targets=dict(targets),
        confidence=confidence,
        evaluations=pd.DataFrame(state.rows),
        runs=runs_frame(records, (parameter,)),
    )
    return result, records
