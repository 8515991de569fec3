"""Running a sweep file: its grid through :func:`~simsim.sweep`, or its capacity searches.

:mod:`simsim.sweeps.spec` reads and checks the file into a :class:`SweepSpec`; this
module runs it into a results folder, with the same functions the Python API uses.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable

import pandas as pd

from simsim.sweeps.capacity import SearchBounds, capacity_frame, points_of, run_searches
from simsim.sweeps.grid import Case, expand_grid
from simsim.sweeps.runner import RunOptions
from simsim.sweeps.spec import SweepSpec
from simsim.sweeps.sweep import SweepResult, make_result, sweep, write_tables

__all__ = ["CAPACITY_FILE", "run_sweep"]

CAPACITY_FILE = "capacity.csv"
"""Where a capacity sweep's folder keeps one row per configuration."""


def run_sweep(
    spec: SweepSpec,
    *,
    out: str | os.PathLike[str],
    executor: concurrent.futures.Executor | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[SweepResult, pd.DataFrame | None]:
    """Run a sweep file into the folder *out*: its grid, or its capacity searches.

    Returns the sweep's tables and, for a ``[capacity]`` file, one row per configuration
    (also written to ``capacity.csv``). A capacity search's runs are the sweep's runs,
    with the configuration as ``case`` and the probed values on the searched axis.
    """
    if spec.capacity is None:
        result = sweep(
            spec.source,
            spec.grid,
            cases=spec.cases,
            replications=spec.replications,
            seed=spec.seed,
            executor=executor,
            workers=workers,
            confidence=spec.confidence,
            ttft_slo_us=spec.ttft_slo_us,
            tpot_slo_us=spec.tpot_slo_us,
            percentiles=spec.percentiles,
            load=spec.load,
            out=out,
            progress=progress,
        )
        return result, None
    capacity = spec.capacity
    configurations = [Case(p.label(), p.settings) for p in expand_grid(spec.grid, spec.cases)]
    searches = run_searches(
        spec.source,
        SearchBounds(
            capacity.parameter,
            capacity.low,
            capacity.high,
            capacity.integer,
            capacity.tolerance,
            capacity.find,
        ),
        configurations,
        targets=capacity.targets,
        replications=spec.replications,
        max_replications=capacity.max_replications,
        confidence=spec.confidence,
        options=RunOptions(
            seed=spec.seed,
            executor=executor,
            workers=workers,
            ttft_slo_us=spec.ttft_slo_us,
            tpot_slo_us=spec.tpot_slo_us,
            percentiles=spec.percentiles,
            out=out,
            progress=progress,
        ),
    )
    result = make_result(
        searches.records,
        points_of(searches.records),
        (capacity.parameter,),
        spec.confidence,
        spec.replications,
        spec.seed,
        reused=searches.reused,
    )
    table = capacity_frame(searches.results, [c.name for c in configurations])
    if searches.folder is not None:
        write_tables(result, searches.folder)
        table.to_csv(searches.folder / CAPACITY_FILE, index=False)
    return result, table
