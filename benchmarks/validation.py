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

Run it as a script to regenerate the table in ``docs/validation.md`` and the plot
``docs/validation_wq.png``::

    python benchmarks/validation.py            # rewrite both
    python benchmarks/validation.py --check    # exit status 1 if the table is stale

The tests (``tests/test_validation_mg1.py``) import this file by its path.
"""

from __future__ import annotations

import argparse
import math
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


@dataclass(frozen=True)
class Case:
    """One validation case: a load, a service model and a simulation budget."""

    rho: float
    service: ServiceModel
    replications: int
    requests: int
    seed: int

    def __post_init__(self) -> None:
        if not 0 < self.rho < 1:
            raise ValueError(f"rho={self.rho}: an M/G/1 queue is stable only for 0 < rho < 1")
        if self.replications < 2:
            raise ValueError(f"replications={self.replications}: an interval needs 2 or more")
        if self.requests - self.warmup < 3:
            raise ValueError(f"requests={self.requests}: too few after the warm-up")

    @property
    def warmup(self) -> int:
        """Requests discarded at the start of each replication."""
        return int(self.requests * WARMUP_FRACTION)

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


def replace_generated_block(document: str, block: str) -> str:
    """*document* with the text between the markers replaced by *block*."""
    begin = document.find(BEGIN_MARKER)
    end = document.find(END_MARKER)
    if begin < 0 or end < begin:
        raise ValueError(f"the document lacks the markers {BEGIN_MARKER!r} ... {END_MARKER!r}")
    head = document[: begin + len(BEGIN_MARKER)]
    return f"{head}\n{block.strip()}\n{document[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the doc's table")
    parser.add_argument("--doc", type=Path, default=DOC_PATH)
    parser.add_argument("--plot", type=Path, default=PLOT_PATH)
    args = parser.parse_args(argv)
    results = []
    for case in CASES:
        result = run_case(case)
        results.append(result)
        status = "ok" if all(e.inside for e in result.estimates.values()) else "OUTSIDE"
        print(f"{case.name}: {status}", file=sys.stderr)
        for estimate in result.estimates.values():
            print(f"  {estimate.describe()}", file=sys.stderr)
    document = args.doc.read_text(encoding="utf-8")
    updated = replace_generated_block(document, render_tables(results))
    if args.check:
        if updated != document:
            print(
                f"{args.doc} is out of date: run python benchmarks/validation.py", file=sys.stderr
            )
            return 1
        return 0
    args.doc.write_text(updated, encoding="utf-8")
    plot_queue_delay(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
