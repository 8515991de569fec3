"""Seeded workload generators: when requests arrive, how long they are, how long clients wait.

Everything here turns one integer seed into the same requests on every machine (for a
given NumPy version): each random quantity is drawn from its own child stream of
``numpy.random.SeedSequence(seed)``, through ``numpy.random.default_rng`` (PCG64). Because
the streams are separate, changing one ingredient leaves the others alone: adding a
patience distribution to a workload does not move a single arrival or token count.

Three kinds of parts fit together:

* **Arrival processes** (:class:`PoissonArrivals`, :class:`GammaArrivals`,
  :class:`FixedRateArrivals`, and :class:`StagedArrivals`, stages of constant rate run
  back to back) give arrival times. Gaps are drawn as real numbers of
  microseconds, summed, and each cumulative offset from the start is rounded once to the
  nearest microsecond, ties to even (``numpy.rint``), so rounding never accumulates.
* **Length distributions** (:class:`Fixed`, :class:`Uniform`, :class:`LogNormal`,
  :class:`Exponential`, :class:`Empirical`) give non-negative integers: prompt and output
  token counts, and durations in microseconds (client patience, think times).
* **Workloads** combine them. :class:`OpenLoopWorkload` makes a fixed list of requests
  (and patience deadlines) up front; :class:`ClosedLoopWorkload` runs one SimPy process
  per user who submits, waits for the answer, thinks, and asks again; :class:`ClassMix`
  merges several :class:`RequestClass` es (interactive chat beside batch jobs, say), each
  with its own arrivals, sizes and metadata (class, tenant, priority, deadline, tags).
"""

from simsim.workloads.arrivals import (
    FixedRateArrivals,
    GammaArrivals,
    PoissonArrivals,
    Stage,
    StagedArrivals,
)
from simsim.workloads.base import (
    MAX_GENERATED_REQUESTS,
    ArrivalProcess,
    LengthDistribution,
    check_request_count,
    check_seed,
)
from simsim.workloads.classes import ClassMix, RequestClass
from simsim.workloads.closed_loop import ClosedLoopRun, ClosedLoopSubmission, ClosedLoopWorkload
from simsim.workloads.lengths import Empirical, Exponential, Fixed, LogNormal, Uniform
from simsim.workloads.open_loop import OpenLoopWorkload, SharedPrefixes
from simsim.workloads.submission import (
    GeneratedWorkload,
    PatienceDeadline,
    WorkloadEngine,
    submit_with_deadlines,
)

__all__ = [
    "MAX_GENERATED_REQUESTS",
    "ArrivalProcess",
    "ClassMix",
    "ClosedLoopRun",
    "ClosedLoopSubmission",
    "ClosedLoopWorkload",
    "Empirical",
    "Exponential",
    "Fixed",
    "FixedRateArrivals",
    "GammaArrivals",
    "GeneratedWorkload",
    "LengthDistribution",
    "LogNormal",
    "OpenLoopWorkload",
    "PatienceDeadline",
    "PoissonArrivals",
    "RequestClass",
    "SharedPrefixes",
    "Stage",
    "StagedArrivals",
    "Uniform",
    "WorkloadEngine",
    "check_request_count",
    "check_seed",
    "submit_with_deadlines",
]
