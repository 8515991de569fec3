"""Sweeps and capacity search: many independent runs, on any executor.

:func:`sweep` runs a grid of scenario settings with seeded replications and returns
tidy tables; :func:`capacity_search` finds the highest load (or the fewest slots) that
meets latency (or occupancy) targets; :func:`plan_capacity` the cheapest GPU type x
tensor parallelism x replicas that serves a workload within SLO targets;
:class:`SweepFolder` reads a finished sweep's results folder back. Sweeps and searches
run through a ``concurrent.futures.Executor``: a local process pool by default, or a
cluster's (Dask's ``Client(...).get_executor()``).
"""

from simsim.sweeps.capacity import CapacityResult, capacity_search
from simsim.sweeps.folder import SweepFolder
from simsim.sweeps.grid import Case, SweepPoint, expand_grid, run_seed
from simsim.sweeps.plan import CapacityPlan, PlannedDeployment, plan_capacity
from simsim.sweeps.runner import SweepFolderError
from simsim.sweeps.signals import SweepStopped
from simsim.sweeps.stats import MeanInterval, mean_interval, metric_range, student_t_quantile
from simsim.sweeps.sweep import SweepResult, aggregate, sweep

__all__ = [
    "CapacityPlan",
    "CapacityResult",
    "Case",
    "MeanInterval",
    "PlannedDeployment",
    "SweepFolder",
    "SweepFolderError",
    "SweepPoint",
    "SweepResult",
    "SweepStopped",
    "aggregate",
    "capacity_search",
    "expand_grid",
    "mean_interval",
    "metric_range",
    "plan_capacity",
    "run_seed",
    "student_t_quantile",
    "sweep",
]
