"""Validate the single-slot engine against M/G/1 queueing theory.

With Poisson arrivals, one slot and FCFS admission, ``simsim.SimulationEngine`` is an
M/G/1 queue whose service time is the prefill plus the decode steps of a request. This
module builds that workload from fixed seeds, runs independent replications through the
engine, and compares what the engine reports with closed forms:

- mean queue delay ``Wq`` (admit - arrival) with the Pollaczek-Khinchine formula
  ``Wq = lambda E[S^2] / (2 (1 - rho))``;
- utilization (busy time over the observation window) with ``rho = lambda E[S]``;
- time-average number in system ``L`` with ``rho + lambda Wq``;
- Little's law: ``L - lambda_hat W`` with ``0`` (``lambda_hat`` the observed arrival rate,
  ``W`` the mean time in system of the requests that arrived in the window).

Each quantity gets a Student-t confidence interval over the replications; a check passes
when the theoretical value lies inside its interval. Every replication is also replayed
through Lindley's recursion (``start = max(arrival, previous finish)``) on the same
arrivals and service times, and the engine's admit and finish times must equal it
exactly. All times are simulated microseconds from an analytical cost model, never
measurements. See ``docs/validation.md`` for the method.

A second part does the same for clusters (``simsim.Cluster``) of many single-slot
replicas with exponential-like service: random routing against Pollaczek-Khinchine at
rate ``lambda / c`` per replica, round robin against E_c/M/1, and join-the-shortest-
queue (``least_outstanding``) against the exact Markov chain of the sorted queue
lengths, with M/M/c (Erlang C) shown as its lower bound.

Run it as a script to regenerate the tables in ``docs/validation.md`` and the plot
``docs/validation_wq.png``::

    python benchmarks/validation.py                  # rewrite all of them
    python benchmarks/validation.py --part cluster   # only the clusters' table
    python benchmarks/validation.py --check          # exit status 1 if a table is stale

The tests (``tests/test_validation_mg1.py``, ``tests/test_validation_cluster.py``)
import this file by its path.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from scipy import stats

import simsim

ROOT = Path(__file__).resolve().parent.parent
DOC_PATH = ROOT / "docs" / "validation.md"
PLOT_PATH = ROOT / "docs" / "validation_wq.png"
BEGIN_MARKER = "<!-- BEGIN GENERATED: python benchmarks/validation.py -->"
END_MARKER = "<!-- END GENERATED -->"

#: The cost model (microseconds). With one active sequence, as on the single slot:
#: prefill_us(p, 1) = 100 + 4 p and decode_step_us(1) = 400.
BACKEND_CONFIG = simsim.SimulatedBackendConfig(
    prefill_base_us=50,
    prefill_per_token_us=4,
    prefill_per_active_sequence_us=50,
    decode_base_us=350,
    decode_per_active_sequence_us=50,
)

#: Fraction of each replication's requests discarded as warm-up (the queue starts empty).
WARMUP_FRACTION = 0.1

#: Family-wise confidence level over all the intervals of the standard cases.
FAMILY_LEVEL = 0.95


@dataclass(frozen=True)
class ServiceModel:
    """A service-time distribution: prompt and output lengths independent and uniform.

    Prompt length is uniform on the integers ``prompt_tokens[0]..prompt_tokens[1]`` and
    the output limit on ``output_tokens[0]..output_tokens[1]`` (both inclusive). A
    request's service time on the single slot is ``prefill_us(prompt, 1)`` plus
    ``output * decode_step_us(1)``. With both ranges a single point it is deterministic.
    """

    name: str
    kendall: str
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]

    def __post_init__(self) -> None:
        for low, high in (self.prompt_tokens, self.output_tokens):
            if not 0 <= low <= high:
                raise ValueError(f"{self.name}: bad token range {low}..{high}")

    def describe(self) -> str:
        """The token lengths in words."""
        (p_low, p_high), (o_low, o_high) = self.prompt_tokens, self.output_tokens
        if p_low == p_high and o_low == o_high:
            plural = "" if o_low == 1 else "s"
            return f"{p_low} prompt tokens and {o_low} output token{plural} for every request"
        return (
            f"prompt tokens uniform on {p_low}..{p_high}, "
            f"output tokens uniform on {o_low}..{o_high}, independent"
        )

    def prefill_costs_us(self, backend: simsim.Backend) -> list[int]:
        """``prefill_us(p, 1)`` for every prompt length ``p`` in the range, in order."""
        low, high = self.prompt_tokens
        return [backend.prefill_us(p, 1) for p in range(low, high + 1)]

    def moments_us(self, backend: simsim.Backend) -> tuple[Fraction, Fraction]:
        """Exact ``(E[S], E[S^2])`` in us and us^2, summed over the whole support."""
        decode_us = backend.decode_step_us(1)
        outputs = range(self.output_tokens[0], self.output_tokens[1] + 1)
        total = total_sq = count = 0
        for prefill_us in self.prefill_costs_us(backend):
            for tokens in outputs:
                service_us = prefill_us + tokens * decode_us
                total += service_us
                total_sq += service_us * service_us
                count += 1
        return Fraction(total, count), Fraction(total_sq, count)

    def sample(
        self, rng: np.random.Generator, size: int
    ) -> tuple[np.ndarray[tuple[int], np.dtype[np.int64]], ...]:
        """Draw ``(prompt_tokens, output_tokens)`` arrays of *size* requests."""
        prompts = rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1, size=size)
        outputs = rng.integers(self.output_tokens[0], self.output_tokens[1] + 1, size=size)
        return prompts.astype(np.int64), outputs.astype(np.int64)


DETERMINISTIC = ServiceModel("deterministic", "M/D/1", (1024, 1024), (1, 1))
UNIFORM = ServiceModel("uniform", "M/G/1", (0, 2048), (0, 2))


def warmup_count(requests: int) -> int:
    """Requests discarded at the start of a replication of *requests* requests."""
    return int(requests * WARMUP_FRACTION)


def check_budget(rho: float, replications: int, requests: int, queue: str) -> None:
    """Refuse a load or a simulation budget that cannot give an interval."""
    if not 0 < rho < 1:
        raise ValueError(f"rho={rho}: {queue} stable only for 0 < rho < 1")
    if replications < 2:
        raise ValueError(f"replications={replications}: an interval needs 2 or more")
    if requests - warmup_count(requests) < 3:
        raise ValueError(f"requests={requests}: too few after the warm-up")


@dataclass(frozen=True)
class Case:
    """One validation case: a load, a service model and a simulation budget."""

    rho: float
    service: ServiceModel
    replications: int
    requests: int
    seed: int

    def __post_init__(self) -> None:
        check_budget(self.rho, self.replications, self.requests, "an M/G/1 queue is")

    @property
    def warmup(self) -> int:
        """Requests discarded at the start of each replication."""
        return warmup_count(self.requests)

    @property
    def name(self) -> str:
        return f"rho{self.rho:g}-{self.service.name}"


#: The standard cases: three loads x two service models. The budget grows with the load,
#: because the variance of a mean waiting time grows roughly like 1 / (1 - rho)^4.
CASES: tuple[Case, ...] = (
    Case(0.3, DETERMINISTIC, replications=10, requests=8_000, seed=3101),
    Case(0.6, DETERMINISTIC, replications=10, requests=20_000, seed=6101),
    Case(0.9, DETERMINISTIC, replications=10, requests=50_000, seed=9101),
    Case(0.3, UNIFORM, replications=10, requests=8_000, seed=3202),
    Case(0.6, UNIFORM, replications=10, requests=20_000, seed=6202),
    Case(0.9, UNIFORM, replications=10, requests=50_000, seed=9202),
)


@dataclass(frozen=True)
class Quantity:
    key: str
    label: str
    unit: str
    fmt: str


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("queue_delay_us", "mean queue delay Wq", "us", ",.0f"),
    Quantity("utilization", "utilization", "", ".4f"),
    Quantity("number_in_system", "mean number in system L", "requests", ".4f"),
    Quantity("little_gap", "Little's law L - lambda_hat W", "requests", ".2e"),
)

#: Per-interval confidence level: Bonferroni over every interval of the standard cases,
#: so a correct simulator fails none of them with probability at least FAMILY_LEVEL.
LEVEL = 1.0 - (1.0 - FAMILY_LEVEL) / (len(CASES) * len(QUANTITIES))


@dataclass(frozen=True)
class Theory:
    """Closed forms for an M/G/1 FCFS queue (times in us, rates per us)."""

    arrival_rate_per_us: float
    mean_service_us: float
    second_moment_us2: float

    @classmethod
    def of(cls, case: Case, backend: simsim.Backend) -> Theory:
        mean, second = case.service.moments_us(backend)
        return cls(case.rho / float(mean), float(mean), float(second))

    @property
    def rho(self) -> float:
        return self.arrival_rate_per_us * self.mean_service_us

    @property
    def queue_delay_us(self) -> float:
        """Pollaczek-Khinchine: ``lambda E[S^2] / (2 (1 - rho))``."""
        return self.arrival_rate_per_us * self.second_moment_us2 / (2.0 * (1.0 - self.rho))

    @property
    def number_in_system(self) -> float:
        """``L = rho + lambda Wq`` (= lambda W by Little's law)."""
        return self.rho + self.arrival_rate_per_us * self.queue_delay_us

    def value(self, key: str) -> float:
        return {
            "queue_delay_us": self.queue_delay_us,
            "utilization": self.rho,
            "number_in_system": self.number_in_system,
            "little_gap": 0.0,
        }[key]


@dataclass(frozen=True)
class Replication:
    """What one replication measured over its observation window."""

    queue_delay_us: float
    utilization: float
    number_in_system: float
    little_gap: float
    sojourn_us: float
    arrival_rate_per_us: float
    observed_requests: int
    lindley_mismatches: int

    def value(self, key: str) -> float:
        return float(getattr(self, key))


@dataclass(frozen=True)
class Estimate:
    """A quantity's theoretical value, replication mean and confidence interval."""

    quantity: Quantity
    theory: float
    mean: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.theory <= self.high

    def describe(self) -> str:
        q = self.quantity
        return (
            f"{q.label}: theory {self.theory:{q.fmt}}, simulated {self.mean:{q.fmt}}, "
            f"CI [{self.low:{q.fmt}}, {self.high:{q.fmt}}]"
        )


@dataclass(frozen=True)
class CaseResult:
    case: Case
    theory: Theory
    replications: tuple[Replication, ...]
    estimates: dict[str, Estimate]
    level: float

    @property
    def lindley_mismatches(self) -> int:
        return sum(r.lindley_mismatches for r in self.replications)


def make_backend() -> simsim.SimulatedBackend:
    return simsim.SimulatedBackend(BACKEND_CONFIG)


def poisson_arrivals_us(
    rng: np.random.Generator, rate_per_us: float, size: int
) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    """Arrival times of a Poisson process, each rounded to the nearest microsecond.

    The continuous arrival times are rounded (not the gaps), so every arrival moves by at
    most half a microsecond and the long-run rate is exactly *rate_per_us*.
    """
    times = np.cumsum(rng.exponential(1.0 / rate_per_us, size=size))
    return np.rint(times).astype(np.int64)


def lindley(arrivals_us: Sequence[int], services_us: Sequence[int]) -> tuple[list[int], list[int]]:
    """Start and finish times of a FCFS single server, by Lindley's recursion."""
    starts: list[int] = []
    finishes: list[int] = []
    free_at = 0
    for arrival, service in zip(arrivals_us, services_us, strict=True):
        start = arrival if arrival > free_at else free_at
        free_at = start + service
        starts.append(start)
        finishes.append(free_at)
    return starts, finishes


def _overlap_total(
    start: np.ndarray[tuple[int], np.dtype[np.int64]],
    end: np.ndarray[tuple[int], np.dtype[np.int64]],
    window_start: int,
    window_end: int,
) -> int:
    """Total length of the intervals ``[start, end)`` inside ``[window_start, window_end)``."""
    lengths = np.minimum(end, window_end) - np.maximum(start, window_start)
    return int(np.clip(lengths, 0, None).sum())


def run_replication(case: Case, seed: np.random.SeedSequence) -> Replication:
    """Simulate one replication of *case* from *seed* and measure it.

    Requests ``0..n-1`` arrive in order. The first ``w = case.warmup`` are warm-up. The
    observation window is ``[t0, t1)`` from the arrival of request ``w`` to the arrival
    of the last request ``n-1``; the observed requests are those arriving in it
    (``w <= i < n-1``). Queue delay and time in system are averaged over the observed
    requests; utilization and the number in system are exact time averages over the
    window of the busy indicator and of ``arrivals - departures`` (every request's
    ``[admit, finish)`` and ``[arrival, finish)`` interval clipped to the window).
    """
    backend = make_backend()
    theory = Theory.of(case, backend)
    arrival_rng, service_rng = (np.random.default_rng(s) for s in seed.spawn(2))
    n = case.requests
    arrivals = poisson_arrivals_us(arrival_rng, theory.arrival_rate_per_us, n)
    prompts, outputs = case.service.sample(service_rng, n)

    engine = simsim.SimulationEngine(backend)
    for request_id, (arrival, prompt, output) in enumerate(
        zip(arrivals.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
    ):
        engine.submit(simsim.Request(request_id, arrival, prompt, output))
    engine.run()
    frame = engine.requests_frame()
    if not (frame["state"] == "FINISHED").all():
        raise RuntimeError(f"{case.name}: not every request finished")
    arrival_us = frame["arrival_time_us"].to_numpy(dtype=np.int64)
    admit_us = frame["admit_time_us"].to_numpy(dtype=np.int64)
    finish_us = frame["finish_time_us"].to_numpy(dtype=np.int64)
    queue_delay_us = frame["queue_delay_us"].to_numpy(dtype=np.int64)

    # The same sample path by Lindley's recursion, with services priced by the backend.
    prefill_costs = np.asarray(case.service.prefill_costs_us(backend), dtype=np.int64)
    services = prefill_costs[prompts - case.service.prompt_tokens[0]]
    services = services + outputs * backend.decode_step_us(1)
    starts, finishes = lindley(arrivals.tolist(), services.tolist())
    mismatches = int(
        np.count_nonzero(
            (np.asarray(starts, dtype=np.int64) != admit_us)
            | (np.asarray(finishes, dtype=np.int64) != finish_us)
        )
    )

    w = case.warmup
    t0, t1 = int(arrival_us[w]), int(arrival_us[n - 1])
    window_us = t1 - t0
    observed = slice(w, n - 1)
    observed_count = n - 1 - w
    sojourn_us = float((finish_us[observed] - arrival_us[observed]).mean())
    rate = observed_count / window_us
    number_in_system = _overlap_total(arrival_us, finish_us, t0, t1) / window_us
    return Replication(
        queue_delay_us=float(queue_delay_us[observed].mean()),
        utilization=_overlap_total(admit_us, finish_us, t0, t1) / window_us,
        number_in_system=number_in_system,
        little_gap=number_in_system - rate * sojourn_us,
        sojourn_us=sojourn_us,
        arrival_rate_per_us=rate,
        observed_requests=observed_count,
        lindley_mismatches=mismatches,
    )


def confidence_interval(values: Sequence[float], level: float) -> tuple[float, float, float]:
    """``(mean, low, high)``: the Student-t interval for the mean of *values*."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        raise ValueError("a confidence interval needs at least two replications")
    mean = float(data.mean())
    half = float(stats.t.ppf(0.5 + level / 2.0, data.size - 1)) * float(
        data.std(ddof=1) / math.sqrt(data.size)
    )
    return mean, mean - half, mean + half


def run_case(case: Case, level: float = LEVEL) -> CaseResult:
    """All replications of *case* (seeds spawned from ``case.seed``) and their intervals."""
    theory = Theory.of(case, make_backend())
    seeds = np.random.SeedSequence(case.seed).spawn(case.replications)
    replications = tuple(run_replication(case, seed) for seed in seeds)
    estimates = {}
    for quantity in QUANTITIES:
        mean, low, high = confidence_interval([r.value(quantity.key) for r in replications], level)
        estimates[quantity.key] = Estimate(quantity, theory.value(quantity.key), mean, low, high)
    return CaseResult(case, theory, replications, estimates, level)


def render_tables(results: Sequence[CaseResult]) -> str:
    """The Markdown block for ``docs/validation.md``: one table per case."""
    rho = "\N{GREEK SMALL LETTER RHO}"
    lines = [
        "Backend: `prefill_us(p, 1) = "
        f"{make_backend().prefill_us(0, 1)} + {BACKEND_CONFIG.prefill_per_token_us} p`, "
        f"`decode_step_us(1) = {make_backend().decode_step_us(1)}` (simulated microseconds).",
        "",
    ]
    for result in results:
        case, theory = result.case, result.theory
        model = case.service
        lines += [
            f"### {rho} = {case.rho:g}, {model.name} service ({model.kendall})",
            "",
            f"Service: {model.describe()}. E[S] = {theory.mean_service_us:,.2f} us, "
            f"E[S^2] = {theory.second_moment_us2:,.0f} us^2, "
            f"lambda = {theory.arrival_rate_per_us * 1e6:,.3f} requests/s. "
            f"{case.replications} replications x {case.requests:,} requests "
            f"(first {case.warmup:,} discarded), seed {case.seed}; "
            f"Lindley mismatches: {result.lindley_mismatches}.",
            "",
            f"| {rho} | service | quantity | theory | simulated mean "
            f"| {result.level:.2%} CI | replications | requests/replication | inside |",
            "|---|---|---|---:|---:|---|---:|---:|---|",
        ]
        for estimate in result.estimates.values():
            q = estimate.quantity
            unit = f" ({q.unit})" if q.unit else ""
            theory_text = "0" if estimate.theory == 0 else f"{estimate.theory:{q.fmt}}"
            lines.append(
                f"| {case.rho:g} | {model.name} | {q.label}{unit} | {theory_text} "
                f"| {estimate.mean:{q.fmt}} | [{estimate.low:{q.fmt}}, {estimate.high:{q.fmt}}] "
                f"| {case.replications} | {case.requests:,} | "
                f"{'yes' if estimate.inside else '**NO**'} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_queue_delay(results: Sequence[CaseResult], path: Path) -> None:
    """Simulated mean queue delay with CI error bars against the P-K curve, per model.

    Left: both on a log scale across loads. Right: simulated over theoretical, with the
    interval divided by the theoretical value too, against the line at 1.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ratio_ax) = plt.subplots(
        1, 2, figsize=(11.0, 4.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    models: dict[str, list[CaseResult]] = {}
    for result in results:
        models.setdefault(result.case.service.name, []).append(result)
    rhos = np.linspace(0.05, 0.93, 200)
    for index, (name, group) in enumerate(models.items()):
        theory = group[0].theory
        curve_us = rhos * theory.second_moment_us2 / (2 * theory.mean_service_us * (1 - rhos))
        color = f"C{index}"
        label = f"{name} ({group[0].case.service.kendall})"
        ax.plot(rhos, curve_us / 1e3, color=color, label=f"Pollaczek-Khinchine, {label}")
        offset = 0.008 * (index - 0.5)
        xs = [r.case.rho + offset for r in group]
        estimates = [r.estimates["queue_delay_us"] for r in group]
        means = np.array([e.mean for e in estimates])
        lows = np.array([e.low for e in estimates])
        highs = np.array([e.high for e in estimates])
        theories = np.array([e.theory for e in estimates])
        ax.errorbar(
            xs,
            means / 1e3,
            yerr=[(means - lows) / 1e3, (highs - means) / 1e3],
            fmt="o",
            color=color,
            capsize=4,
            label=f"simsim, {label}, {group[0].level:.2%} CI",
        )
        ratio_ax.errorbar(
            xs,
            means / theories,
            yerr=[(means - lows) / theories, (highs - means) / theories],
            fmt="o",
            color=color,
            capsize=4,
            label=label,
        )
    ax.set_yscale("log")
    ax.set_xlabel(r"offered load $\rho = \lambda\,E[S]$")
    ax.set_ylabel("mean queue delay $W_q$ (simulated ms)")
    ax.set_title("Mean queue delay across loads")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ratio_ax.axhline(1.0, color="black", linewidth=1)
    ratio_ax.set_xlabel(r"offered load $\rho$")
    ratio_ax.set_ylabel("simulated / theoretical $W_q$")
    ratio_ax.set_title("Ratio to Pollaczek-Khinchine, with CI")
    ratio_ax.set_xlim(0.2, 1.0)
    ratio_ax.grid(True, alpha=0.3)
    ratio_ax.legend(fontsize=8)
    fig.suptitle("simsim single-slot engine vs M/G/1 theory (simulated time, not measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def replace_generated_block(
    document: str, block: str, begin_marker: str = BEGIN_MARKER, end_marker: str = END_MARKER
) -> str:
    """*document* with the text between the markers replaced by *block*."""
    begin = document.find(begin_marker)
    end = document.find(end_marker)
    if begin < 0 or end < begin:
        raise ValueError(f"the document lacks the markers {begin_marker!r} ... {end_marker!r}")
    head = document[: begin + len(begin_marker)]
    return f"{head}\n{block.strip()}\n{document[end:]}"


# ================================================================ clusters
#
# Many single-slot replicas behind a router (``simsim.Cluster``): random routing, round
# robin and join-the-shortest-queue against queueing theory (docs/validation.md,
# "Clusters"). The machinery above (Poisson arrivals, Lindley's recursion, Student-t
# intervals, the warm-up) is reused; only the service model, the theory and the table
# are the cluster's own.

#: The clusters' cost model: ``prefill_us(p, 1) = p``, so a request with ``p`` prompt
#: tokens and no output occupies its replica's slot for exactly ``p`` microseconds.
CLUSTER_BACKEND_CONFIG = simsim.SimulatedBackendConfig(prefill_per_token_us=1)

CLUSTER_BEGIN_MARKER = "<!-- BEGIN GENERATED CLUSTERS: python benchmarks/validation.py -->"
CLUSTER_END_MARKER = "<!-- END GENERATED CLUSTERS -->"

#: Built-in router names and the queueing model each one makes of the cluster.
CLUSTER_MODELS = {
    "random": "M/M/1 per replica (Poisson splitting)",
    "round_robin": "E_c/M/1 per replica",
    "least_outstanding": "JSQ, exact Markov chain",
}

#: The Markov chain for join-the-shortest-queue is truncated at the smallest queue
#: length per replica whose stationary probability of blocking an arrival is below this.
JSQ_BLOCKING_TOLERANCE = 1e-8


@dataclass(frozen=True)
class GeometricService:
    """Service times ``floor(X)`` us with ``X`` exponential of mean *scale_us*.

    That is a geometric distribution on ``0, 1, 2, ...``: ``P(S >= k) = q**k`` with
    ``q = exp(-1 / scale_us)``, an exponential distribution rounded down to whole
    microseconds. A request carries ``S`` prompt tokens and no output, so under
    :data:`CLUSTER_BACKEND_CONFIG` it is served in exactly ``S`` us.
    """

    scale_us: float

    @property
    def q(self) -> float:
        return math.exp(-1.0 / self.scale_us)

    def moments_us(self) -> tuple[float, float]:
        """Exact ``(E[S], E[S^2])``: ``q / (1 - q)`` and ``q (1 + q) / (1 - q)^2``."""
        q = self.q
        return q / (1.0 - q), q * (1.0 + q) / (1.0 - q) ** 2

    def sample(
        self, rng: np.random.Generator, size: int
    ) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        """*size* service times (prompt lengths) in whole microseconds."""
        return np.floor(rng.exponential(self.scale_us, size=size)).astype(np.int64)


CLUSTER_SERVICE = GeometricService(2_000.0)


@dataclass(frozen=True)
class ClusterCase:
    """Many single-slot replicas behind one built-in router, at one load."""

    router: str
    replicas: int
    rho: float
    replications: int
    requests: int
    seed: int

    def __post_init__(self) -> None:
        if self.router not in CLUSTER_MODELS:
            raise ValueError(f"router={self.router!r}: choose one of {sorted(CLUSTER_MODELS)}")
        if self.replicas < 1:
            raise ValueError(f"replicas={self.replicas}: a cluster needs at least one")
        check_budget(self.rho, self.replications, self.requests, "every replica is")

    @property
    def warmup(self) -> int:
        """Requests discarded at the start of each replication."""
        return warmup_count(self.requests)

    @property
    def name(self) -> str:
        return f"{self.router}-c{self.replicas}-rho{self.rho:g}"


#: The cluster cases, all with the same service and load per replica, so that the
#: three routers are compared on the same footing; JSQ also with twice the replicas.
CLUSTER_CASES: tuple[ClusterCase, ...] = (
    ClusterCase("random", 8, 0.7, replications=10, requests=40_000, seed=16_101),
    ClusterCase("round_robin", 8, 0.7, replications=10, requests=40_000, seed=16_202),
    ClusterCase("least_outstanding", 8, 0.7, replications=10, requests=40_000, seed=16_303),
    ClusterCase("least_outstanding", 16, 0.7, replications=10, requests=40_000, seed=16_404),
)

#: Per-interval level for the cluster cases: Bonferroni over their intervals.
CLUSTER_LEVEL = 1.0 - (1.0 - FAMILY_LEVEL) / len(CLUSTER_CASES)


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in M/M/c (Erlang's C formula).

    *offered_load* is ``a = lambda E[S] < servers``. Computed from Erlang's B by the
    stable recursion ``B(k) = a B(k-1) / (k + a B(k-1))``, then
    ``C = c B / (c - a (1 - B))``.
    """
    if not 0 <= offered_load < servers:
        raise ValueError(f"offered load {offered_load} must be in [0, {servers})")
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    return servers * blocking / (servers - offered_load * (1.0 - blocking))


def mmc_queue_delay_us(servers: int, rate_per_us: float, mean_service_us: float) -> float:
    """Mean wait in M/M/c: ``C(c, a) E[S] / (c - a)`` with ``a = lambda E[S]``."""
    offered = rate_per_us * mean_service_us
    return erlang_c(servers, offered) * mean_service_us / (servers - offered)


def erlang_arrivals_queue_delay_us(
    phases: int, rate_per_us: float, mean_service_us: float
) -> float:
    """Mean wait in E_k/M/1: interarrival times Erlang with *phases* stages of rate
    *rate_per_us* each (every k-th arrival of a Poisson stream), exponential service.

    GI/M/1: ``Wq = sigma / (mu (1 - sigma))`` where ``sigma`` is the root in (0, 1) of
    ``sigma = A*(mu (1 - sigma))``, ``A*(s) = (lambda / (lambda + s))^k`` the Laplace
    transform of the interarrival time. The fixed-point iteration from 0 increases to
    that root (the smallest root of a convex equation).
    """
    mu = 1.0 / mean_service_us
    if rate_per_us / phases >= mu:
        raise ValueError(f"E_{phases}/M/1 at rho = {rate_per_us / phases / mu} is not stable")
    sigma = 0.0
    for _ in range(100_000):
        following = (rate_per_us / (rate_per_us + mu * (1.0 - sigma))) ** phases
        if abs(following - sigma) < 1e-15:
            return following / (mu * (1.0 - following))
        sigma = following
    raise RuntimeError(f"E_{phases}/M/1: the root did not converge")


@functools.cache
def jsq_queue_delay_us(
    servers: int, rate_per_us: float, mean_service_us: float, max_queue: int
) -> tuple[float, float]:
    """Mean wait under join-the-shortest-queue with exponential service, exactly.

    With identical exponential servers the sorted vector of the replicas' numbers in
    system is a continuous-time Markov chain: an arrival (rate lambda) adds one to a
    smallest entry; each replica holding ``n > 0`` completes at rate mu, taking one
    from its entry. The chain is truncated at *max_queue* per replica (an arrival that
    finds every replica at *max_queue* is lost). Returns ``(Wq, P(block))`` with
    ``Wq = E[number waiting] / (lambda (1 - P(block)))`` (Little's law) from the
    stationary distribution, solved directly (sparse LU).
    """
    from scipy import sparse
    from scipy.sparse import linalg

    mu = 1.0 / mean_service_us
    states = list(itertools.combinations_with_replacement(range(max_queue + 1), servers))
    index = {state: i for i, state in enumerate(states)}
    rows: list[int] = []
    cols: list[int] = []
    rates: list[float] = []
    for i, state in enumerate(states):
        if state[0] < max_queue:  # join the last of the shortest: the vector stays sorted
            last = servers - 1 - state[::-1].index(state[0])
            target = list(state)
            target[last] += 1
            rows.append(i)
            cols.append(index[tuple(target)])
            rates.append(rate_per_us)
        first = 0
        while first < servers:  # every replica with n > 0 jobs completes at rate mu
            end = first
            while end < servers and state[end] == state[first]:
                end += 1
            if state[first] > 0:
                target = list(state)
                target[first] -= 1
                rows.append(i)
                cols.append(index[tuple(target)])
                rates.append((end - first) * mu)
            first = end
    size = len(states)
    generator = sparse.csr_matrix((rates, (rows, cols)), shape=(size, size))
    generator = generator - sparse.diags(np.asarray(generator.sum(axis=1)).ravel())
    # pi Q = 0 with sum(pi) = 1: one balance equation replaced by the normalisation.
    system = generator.T.tolil()
    system[0, :] = 1.0
    rhs = np.zeros(size)
    rhs[0] = 1.0
    pi = linalg.spsolve(system.tocsc(), rhs)
    occupancy = np.asarray(states)
    waiting = (np.clip(occupancy - 1, 0, None).sum(axis=1) * pi).sum()
    blocking = float(pi[occupancy[:, 0] == max_queue].sum())
    return float(waiting / (rate_per_us * (1.0 - blocking))), blocking


@dataclass(frozen=True)
class ClusterTheory:
    """Closed forms for *replicas* single-slot replicas fed a Poisson stream of rate
    *arrival_rate_per_us*, with service moments in us and us^2."""

    replicas: int
    arrival_rate_per_us: float
    mean_service_us: float
    second_moment_us2: float

    @classmethod
    def of(cls, case: ClusterCase) -> ClusterTheory:
        mean, second = CLUSTER_SERVICE.moments_us()
        return cls(case.replicas, case.rho * case.replicas / mean, mean, second)

    @property
    def rho(self) -> float:
        """Load per replica, ``lambda E[S] / c``."""
        return self.arrival_rate_per_us * self.mean_service_us / self.replicas

    @property
    def random_queue_delay_us(self) -> float:
        """Random routing: every replica is M/G/1 at rate ``lambda / c`` (Pollaczek-Khinchine)."""
        return Theory(
            self.arrival_rate_per_us / self.replicas, self.mean_service_us, self.second_moment_us2
        ).queue_delay_us

    @property
    def round_robin_queue_delay_us(self) -> float:
        """Round robin: every replica is E_c/M/1."""
        return erlang_arrivals_queue_delay_us(
            self.replicas, self.arrival_rate_per_us, self.mean_service_us
        )

    @property
    def mmc_queue_delay_us(self) -> float:
        """One central FCFS queue in front of the c slots (M/M/c), a lower bound for JSQ."""
        return mmc_queue_delay_us(self.replicas, self.arrival_rate_per_us, self.mean_service_us)

    def jsq(self) -> tuple[float, float, int]:
        """``(Wq, P(block), max_queue)`` of the JSQ chain at the smallest truncation whose
        blocking probability is below :data:`JSQ_BLOCKING_TOLERANCE`."""
        max_queue = 2
        while True:
            delay, blocking = jsq_queue_delay_us(
                self.replicas, self.arrival_rate_per_us, self.mean_service_us, max_queue
            )
            if blocking < JSQ_BLOCKING_TOLERANCE:
                return delay, blocking, max_queue
            max_queue += 1

    def queue_delay_us(self, router: str) -> float:
        """The theoretical mean wait under *router*."""
        if router == "random":
            return self.random_queue_delay_us
        if router == "round_robin":
            return self.round_robin_queue_delay_us
        if router == "least_outstanding":
            return self.jsq()[0]
        raise ValueError(f"no theory for router {router!r}")


@dataclass(frozen=True)
class ClusterReplication:
    """What one cluster replication measured."""

    queue_delay_us: float
    observed_requests: int
    lindley_mismatches: int
    routing_mismatches: int


@dataclass(frozen=True)
class ClusterResult:
    case: ClusterCase
    theory: ClusterTheory
    replications: tuple[ClusterReplication, ...]
    estimate: Estimate
    level: float

    @property
    def lindley_mismatches(self) -> int:
        return sum(r.lindley_mismatches for r in self.replications)

    @property
    def routing_mismatches(self) -> int:
        return sum(r.routing_mismatches for r in self.replications)


def run_cluster_replication(case: ClusterCase, seed: np.random.SeedSequence) -> ClusterReplication:
    """Simulate one replication of *case* from *seed* and measure it.

    Requests arrive in id order; the first ``case.warmup`` are warm-up and the observed
    ones are ``warmup <= i < n - 1``, as for the single slot. Every replica is replayed
    through Lindley's recursion on the requests routed to it, and must agree exactly.
    Round robin's routes are checked against ``id mod c``; random routing's against the
    router's own generator replayed.
    """
    backend = simsim.SimulatedBackend(CLUSTER_BACKEND_CONFIG)
    theory = ClusterTheory.of(case)
    arrival_seed, service_seed, router_seed = seed.spawn(3)
    n = case.requests
    arrivals = poisson_arrivals_us(
        np.random.default_rng(arrival_seed), theory.arrival_rate_per_us, n
    )
    services = CLUSTER_SERVICE.sample(np.random.default_rng(service_seed), n)
    router_state = int(router_seed.generate_state(1)[0])

    env = simsim.Environment()
    replicas = [simsim.SimulationEngine(backend, env=env) for _ in range(case.replicas)]
    router: simsim.cluster.Router
    if case.router == "random":
        router = simsim.cluster.RandomRouter(router_state)
    else:
        router = simsim.cluster.make_router(case.router)
    cluster = simsim.Cluster(replicas, router)
    for request_id, (arrival, service) in enumerate(
        zip(arrivals.tolist(), services.tolist(), strict=True)
    ):
        cluster.submit(simsim.Request(request_id, arrival, service, 0))
    cluster.run()
    frame = cluster.requests_frame()
    if not (frame["state"] == "FINISHED").all():
        raise RuntimeError(f"{case.name}: not every request finished")
    routed = frame["replica"].to_numpy(dtype=np.int64)
    admit_us = frame["admit_time_us"].to_numpy(dtype=np.int64)
    finish_us = frame["finish_time_us"].to_numpy(dtype=np.int64)

    mismatches = 0
    for replica in range(case.replicas):
        mine = routed == replica
        starts, finishes = lindley(arrivals[mine].tolist(), services[mine].tolist())
        mismatches += int(
            np.count_nonzero(
                (np.asarray(starts, dtype=np.int64) != admit_us[mine])
                | (np.asarray(finishes, dtype=np.int64) != finish_us[mine])
            )
        )
    if case.router == "round_robin":
        expected = np.arange(n) % case.replicas
    elif case.router == "random":
        draws = random.Random(router_state)
        expected = np.asarray([draws.randrange(case.replicas) for _ in range(n)])
    else:
        expected = routed  # JSQ's choices depend on the state: the chain checks them
    observed = slice(case.warmup, n - 1)
    queue_delay_us = frame["queue_delay_us"].to_numpy(dtype=np.int64)[observed]
    return ClusterReplication(
        queue_delay_us=float(queue_delay_us.mean()),
        observed_requests=len(queue_delay_us),
        lindley_mismatches=mismatches,
        routing_mismatches=int(np.count_nonzero(expected != routed)),
    )


def run_cluster_case(case: ClusterCase, level: float = CLUSTER_LEVEL) -> ClusterResult:
    """All replications of *case* (seeds spawned from ``case.seed``) and the interval of
    the mean queue delay against the router's theory."""
    theory = ClusterTheory.of(case)
    seeds = np.random.SeedSequence(case.seed).spawn(case.replications)
    replications = tuple(run_cluster_replication(case, seed) for seed in seeds)
    mean, low, high = confidence_interval([r.queue_delay_us for r in replications], level)
    estimate = Estimate(QUANTITIES[0], theory.queue_delay_us(case.router), mean, low, high)
    return ClusterResult(case, theory, replications, estimate, level)


def render_cluster_table(results: Sequence[ClusterResult]) -> str:
    """The Markdown block for the clusters' part of ``docs/validation.md``."""
    rho = "\N{GREEK SMALL LETTER RHO}"
    mean, second = CLUSTER_SERVICE.moments_us()
    level = results[0].level if results else CLUSTER_LEVEL
    lines = [
        f"Service: `floor(X)` us, X exponential of mean {CLUSTER_SERVICE.scale_us:,.0f} us "
        f"(E[S] = {mean:,.2f} us, E[S^2] = {second:,.0f} us^2). Mean queue delay Wq in "
        "simulated microseconds; every interval at the same level, Bonferroni over the "
        "table.",
        "",
        f"| router | replicas c | {rho} | model | theory Wq | simulated mean "
        f"| {level:.2%} CI | inside | M/M/c Wq | M/M/1 Wq (random) "
        "| replications x requests | Lindley / routing mismatches |",
        "|---|---:|---:|---|---:|---:|---|---|---:|---:|---|---|",
    ]
    for result in results:
        case, theory, estimate = result.case, result.theory, result.estimate
        lines.append(
            f"| {case.router} | {case.replicas} | {case.rho:g} | {CLUSTER_MODELS[case.router]} "
            f"| {estimate.theory:,.1f} | {estimate.mean:,.1f} "
            f"| [{estimate.low:,.1f}, {estimate.high:,.1f}] "
            f"| {'yes' if estimate.inside else '**NO**'} "
            f"| {theory.mmc_queue_delay_us:,.1f} | {theory.random_queue_delay_us:,.1f} "
            f"| {case.replications} x {case.requests:,} "
            f"| {result.lindley_mismatches} / {result.routing_mismatches} |"
        )
    lines.append("")
    for result in results:
        if result.case.router == "least_outstanding":
            _, blocking, max_queue = result.theory.jsq()
            lines.append(
                f"- JSQ with c = {result.case.replicas}: chain truncated at {max_queue} "
                f"requests per replica, P(block) = {blocking:.1e}; simulated Wq is "
                f"{result.estimate.mean / result.theory.mmc_queue_delay_us:.2f} x M/M/c's; "
                f"mean time in system {result.estimate.mean + mean:,.0f} us against "
                f"M/M/c's {result.theory.mmc_queue_delay_us + mean:,.0f} us "
                f"({(result.estimate.mean - result.theory.mmc_queue_delay_us) / mean:.1%} "
                "of E[S] apart)."
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the doc's tables")
    parser.add_argument("--doc", type=Path, default=DOC_PATH)
    parser.add_argument("--plot", type=Path, default=PLOT_PATH)
    parser.add_argument(
        "--part",
        choices=("all", "single", "cluster"),
        default="all",
        help="the single slot's M/G/1 cases, the cluster cases, or both (default)",
    )
    args = parser.parse_args(argv)
    document = args.doc.read_text(encoding="utf-8")
    updated = document
    results = []
    if args.part in ("all", "single"):
        for case in CASES:
            result = run_case(case)
            results.append(result)
            status = "ok" if all(e.inside for e in result.estimates.values()) else "OUTSIDE"
            print(f"{case.name}: {status}", file=sys.stderr)
            for estimate in result.estimates.values():
                print(f"  {estimate.describe()}", file=sys.stderr)
        updated = replace_generated_block(updated, render_tables(results))
    if args.part in ("all", "cluster"):
        cluster_results = []
        for cluster_case in CLUSTER_CASES:
            cluster_result = run_cluster_case(cluster_case)
            cluster_results.append(cluster_result)
            status = "ok" if cluster_result.estimate.inside else "OUTSIDE"
            print(f"{cluster_case.name}: {status}", file=sys.stderr)
            print(f"  {cluster_result.estimate.describe()}", file=sys.stderr)
        updated = replace_generated_block(
            updated,
            render_cluster_table(cluster_results),
            CLUSTER_BEGIN_MARKER,
            CLUSTER_END_MARKER,
        )
    if args.check:
        if updated != document:
            print(
                f"{args.doc} is out of date: run python benchmarks/validation.py", file=sys.stderr
            )
            return 1
        return 0
    args.doc.write_text(updated, encoding="utf-8")
    if results:
        plot_queue_delay(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
