"""``simsim.sweep``: a grid of scenario settings, replicated, run on any executor."""

from __future__ import annotations

import concurrent.futures
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simsim.results import DEFAULT_PERCENTILES
from simsim.sweeps.grid import MAX_RUNS, Case, SweepPoint, check_run_count, expand_grid
from simsim.sweeps.runner import (
    MANIFEST,
    Model,
    Runner,
    RunOptions,
    RunRecord,
    ScenarioSource,
    resolve_source,
    write_json,
)
from simsim.sweeps.stats import mean_interval, metric_range
from simsim.wording import counted

__all__ = ["SUMMARY_COLUMNS", "SweepResult", "aggregate", "runs_frame", "sweep"]

RUNS_FILE = "runs.csv"
"""Where a results folder keeps :attr:`SweepResult.runs`."""

SUMMARY_FILE = "summary.csv"
"""Where a results folder keeps :attr:`SweepResult.summary`."""

SUMMARY_COLUMNS = ("metric", "mean", "std", "count", "ci_low", "ci_high")
"""The columns :func:`aggregate` adds after the point's own columns."""


@dataclass(frozen=True)
class SweepResult:
    """What :func:`sweep` returns.

    ``runs`` is tidy: one row per (point, replication), with the columns ``point``,
    ``case`` (when cases were given), one column per grid axis, ``replication``,
    ``seed``, then every metric of :func:`simsim.summarize`. ``summary`` has one row per
    (point, metric): the point's columns, then ``metric, mean, std, count, ci_low,
    ci_high`` (a two-sided Student-t interval at ``confidence`` over the replications,
    clipped to the metric's range). ``point`` is ``int64`` in both tables, and every axis
    has the same dtype in both.
    ``load`` names the axis that plots put on the x axis. ``reused`` counts the runs
    loaded from the results folder instead of being run.
    """

    runs: pd.DataFrame
    summary: pd.DataFrame
    axes: tuple[str, ...]
    cases: tuple[str, ...]
    load: str | None
    confidence: float
    replications: int
    seed: int
    reused: int = 0


def point_columns(points: Sequence[SweepPoint], axes: Sequence[str]) -> list[str]:
    """The columns that name a point: ``point``, ``case`` if any, then the axes."""
    has_cases = any(p.case is not None for p in points)
    return ["point", *(["case"] if has_cases else []), *axes]


def runs_frame(records: Sequence[RunRecord], axes: Sequence[str]) -> pd.DataFrame:
    """The tidy table of runs, sorted by point then replication."""
    points = [r.point for r in records]
    has_cases = any(p.case is not None for p in points)
    rows = []
    for record in sorted(records, key=lambda r: (r.point.index, r.replication)):
        row: dict[str, Any] = {"point": record.point.index}
        if has_cases:
            row["case"] = record.point.case
        row.update({axis: record.point.params.get(axis) for axis in axes})
        row["replication"] = record.replication
        row["seed"] = record.seed
        row.update(record.metrics)
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column in ("point", "replication", "seed"):
        if column in frame:
            frame[column] = frame[column].astype("int64")
    return frame


def aggregate(runs: pd.DataFrame, by: Sequence[str], confidence: float = 0.95) -> pd.DataFrame:
    """One row per (group of *by*, metric): mean, std, count and the CI of the metric.

    Metrics are every column of *runs* that is neither in *by* nor ``replication`` or
    ``seed``. NaN values (a run that could not measure the metric) are left out. Each
    interval is clipped to its metric's range (:func:`~simsim.sweeps.stats.metric_range`):
    fractions to [0, 1], counts, durations and rates to 0 and above, a column the names
    of summarize's metrics do not describe not at all. The *by* columns keep their
    dtypes from *runs* (``point`` stays ``int64``).
    """
    metrics = [c for c in runs.columns if c not in (*by, "replication", "seed")]
    # Group on a text form of the keys: a grid value may be a list or a table.
    labels = [
        json.dumps(row, sort_keys=True, default=str) for row in runs[list(by)].to_numpy().tolist()
    ]
    rows = []
    for _, group in runs.groupby(pd.Series(labels, index=runs.index), sort=False):
        # Column by column: a row of ints and floats would come back all floats.
        key_values = [group[column].iloc[0] for column in by]
        for metric in metrics:
            interval = mean_interval(
                group[metric].astype("float64"), confidence, bounds=metric_range(metric)
            )
            rows.append(
                (
                    *key_values,
                    metric,
                    interval.mean,
                    interval.std,
                    interval.count,
                    interval.low,
                    interval.high,
                )
            )
    summary = pd.DataFrame(rows, columns=[*by, *SUMMARY_COLUMNS])
    return summary.astype({column: runs[column].dtype for column in by})


def default_load_axis(axes: Sequence[str]) -> str | None:
    """The axis plots put on the x axis: the first one about a rate, else the first."""
    for axis in axes:
        if "rate" in axis.rsplit(".", 1)[-1]:
            return axis
    return axes[0] if axes else None


def normalize_cases(
    cases: Sequence[Case] | Mapping[str, Mapping[str, Any]] | None,
) -> list[Case] | None:
    """Cases given as a mapping ``{name: {key: value}}`` or as :class:`Case` objects."""
    if cases is None:
        return None
    if isinstance(cases, Mapping):
        return [Case(str(name), dict(settings)) for name, settings in cases.items()]
    result = []
    for case in cases:
        if not isinstance(case, Case):
            raise TypeError(f"cases: expected simsim.sweeps.Case objects, got {case!r}")
        result.append(case)
    return result


def check_replications(replications: object, name: str = "replications") -> int:
    """A positive int number of replications, at most :data:`~simsim.sweeps.grid.MAX_RUNS`."""
    if isinstance(replications, bool) or not isinstance(replications, int) or replications < 1:
        raise ValueError(f"{name} must be a positive int, got {replications!r}")
    if replications > MAX_RUNS:
        raise ValueError(
            f"{name} must be at most {MAX_RUNS:,} (the most runs a sweep may make; every run "
            f"is a whole simulation), got {replications:,}"
        )
    return replications


def check_confidence(confidence: object) -> float:
    """A confidence level strictly between 0 and 1."""
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not 0 < confidence < 1
    ):
        raise ValueError(
            f"confidence must be a number strictly between 0 and 1, got {confidence!r}"
        )
    return float(confidence)


def sweep(
    scenario: str | os.PathLike[str] | Mapping[str, Any] | Model | ScenarioSource,
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    cases: Sequence[Case] | Mapping[str, Mapping[str, Any]] | None = None,
    replications: int = 3,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
    workers: int | None = None,
    confidence: float = 0.95,
    ttft_slo_us: int | None = None,
    tpot_slo_us: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    load: str | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run every point of *grid* (crossed with *cases*) *replications* times.

    *scenario* is a TOML scenario file, a scenario document (the dict ``tomllib``
    reads), or a model ``callable(settings, seed) -> requests_frame`` (``simsim sweep``
    passes the scenario its sweep file names). *grid* maps dotted
    scenario keys (``"workload.rate_per_s"``, ``"batching.max_active_requests"``,
    ``"backend.decode_base_us"``: anything a scenario file can set) to lists of values;
    *cases* are named sets of settings applied before the grid's (e.g. one per engine).
    Every point's scenario is validated before anything runs.

    Run *r* of a point gets the scenario seed ``SeedSequence(seed, spawn_key=(point
    key, r))``, where the point key is a hash of the case and settings; so results do
    not depend on the executor, the number of workers or the completion order.

    Runs go through *executor* (any ``concurrent.futures.Executor``, such as Dask's
    ``Client(...).get_executor()``, which the caller owns), or a process pool of
    *workers* processes (default: one per CPU; ``workers=1`` runs in this process).
    With *out*, each finished run is written to that folder at once, and a later call
    with the same folder reuses finished runs instead of running them again; the
    tables are written there as ``runs.csv`` and ``summary.csv``. *ttft_slo_us*,
    *tpot_slo_us* and *percentiles* are passed to :func:`simsim.summarize` for every
    run. *progress* is called with (runs done, runs in all).
    """
    source = resolve_source(scenario)
    replications = check_replications(replications)
    confidence = check_confidence(confidence)
    points = expand_grid(grid, normalize_cases(cases))
    check_run_count(
        len(points) * replications,
        f"{counted(len(points), 'point')} x {counted(replications, 'replication')}",
    )
    axes = tuple(points[0].params) if points else ()
    if load is not None and load not in axes:
        raise ValueError(f"load must be one of the grid's axes {list(axes)}, got {load!r}")
    for point in points:
        source.check(point)
    pairs = [(point, r) for point in points for r in range(replications)]
    options = RunOptions(
        seed, executor, workers, ttft_slo_us, tpot_slo_us, percentiles, out, progress
    )
    with Runner(source, options) as runner:
        runner.expect(len(pairs))
        records = runner.run(pairs)
    result = make_result(
        records,
        points,
        axes,
        confidence,
        replications,
        runner.seed,
        load=load,
        reused=runner.loaded,
    )
    if runner.folder is not None:
        write_tables(result, runner.folder)
    return result


def make_result(
    records: Sequence[RunRecord],
    points: Sequence[SweepPoint],
    axes: Sequence[str],
    confidence: float,
    replications: int,
    seed: int,
    *,
    load: str | None = None,
    reused: int = 0,
) -> SweepResult:
    """Tidy and aggregated tables of *records*, packed as a :class:`SweepResult`."""
    runs = runs_frame(records, axes)
    return SweepResult(
        runs=runs,
        summary=aggregate(runs, point_columns(points, axes), confidence),
        axes=tuple(axes),
        cases=tuple(dict.fromkeys(p.case for p in points if p.case is not None)),
        load=load if load is not None else default_load_axis(axes),
        confidence=confidence,
        replications=replications,
        seed=seed,
        reused=reused,
    )


def write_tables(result: SweepResult, folder: Path) -> None:
    """Write ``runs.csv``, ``summary.csv`` and the manifest's description of the sweep."""
    result.runs.to_csv(folder / RUNS_FILE, index=False)
    result.summary.to_csv(folder / SUMMARY_FILE, index=False)
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest.update(
        {
            "axes": list(result.axes),
            "cases": list(result.cases),
            "load": result.load,
            "confidence": result.confidence,
            "replications": result.replications,
            "seed": result.seed,
        }
    )
    write_json(manifest_path, manifest)


def is_sweep_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether *folder* was written by a sweep (it has the sweep's manifest)."""
    return (Path(folder) / MANIFEST).is_file()
