"""Priority classes and shortest job first on the single slot, against queueing theory.

Poisson arrivals on ``simsim.SimulationEngine`` make an M/G/1 queue (see
``docs/validation.md``); changing the scheduler changes only the order of service, and
two classic results give what each order should produce:

- **Cobham's formula** (``PriorityScheduler``): with classes numbered from the most
  urgent, ``rho_i = lambda_i E[S_i]``, ``sigma_k = rho_1 + ... + rho_k`` and the mean
  residual work ``W0 = sum_i lambda_i E[S_i^2] / 2``, class ``k``'s mean queue delay is
  ``W_k = W0 / ((1 - sigma_{k-1}) (1 - sigma_k))``.
- **Non-preemptive shortest job first** (``ShortestJobFirstScheduler`` told each job's
  exact service time): a job of service time ``x`` waits on average
  ``W(x) = W0 / ((1 - rho(<x)) (1 - rho(<=x)))``, where ``rho(<x)`` is the load brought
  by jobs shorter than ``x``. FCFS waits ``W0 / (1 - rho)`` (Pollaczek-Khinchine).

Each case runs independent replications from fixed seeds and gives a Student-t interval
per quantity (Bonferroni over the family, as in ``benchmarks/validation.py``, whose
workload pieces it reuses). Every replication is also replayed by a plain non-preemptive
single-server loop that serves the waiting request with the least
``(key, arrival, id)``; the engine's admit times must equal the replay's exactly.

The second table compares FCFS, shortest job first and shortest job first with aging at
rho = 0.9 on a mix of short and long jobs: mean and p99 response time overall, and the
p99 of the long jobs, which shortest job first makes wait and aging bounds.

Run it:  python benchmarks/schedulers.py [--quick]
All times are simulated microseconds from the analytical cost model, never measurements;
``tests/test_validation_priority.py`` imports this file by its path.
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import simsim
from simsim.schedulers import PriorityScheduler, ShortestJobFirstScheduler


def _load_validation() -> ModuleType:
    """``benchmarks/validation.py``, the M/G/1 check whose workload pieces are reused."""
    path = Path(__file__).resolve().parent / "validation.py"
    name = "_simsim_benchmarks_validation_for_schedulers"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up while decorating
    spec.loader.exec_module(module)
    return module


validation = _load_validation()
ServiceModel = validation.ServiceModel
make_backend = validation.make_backend
confidence_interval = validation.confidence_interval
Estimate = validation.Estimate

#: Family-wise confidence level over every interval of PRIORITY_CASES and SJF_CASE.
FAMILY_LEVEL = 0.95

#: Service times (us) on the single slot, ``100 + 4 prompt + 400 output``: short
#: requests 100..1,924, medium 100..9,092 and long 8,292..17,284. Outputs of 0..2
#: tokens keep the number of decode events, and so the run time, small.
SHORT = ServiceModel("short", "", (0, 256), (0, 2))
MEDIUM = ServiceModel("medium", "", (0, 2048), (0, 2))
LONG = ServiceModel("long", "", (2048, 4096), (0, 2))

Array = np.ndarray[tuple[int], np.dtype[np.int64]]


# ------------------------------------------------------------------ workload


@dataclass(frozen=True)
class JobClass:
    """A class of requests: its Poisson share of the load and its service distribution.

    ``priority`` is the request's ``priority`` (lower runs first under
    ``PriorityScheduler``); ``rho`` is the load the class brings, ``lambda E[S]``.
    """

    name: str
    priority: int
    rho: float
    service: ServiceModel


@dataclass(frozen=True)
class Workload:
    """Independent Poisson streams, one per class, merged (ids in arrival order)."""

    arrivals_us: Array
    classes: Array  # index into the case's classes
    prompts: Array
    outputs: Array
    services_us: Array


def moments(job_class: JobClass, backend: simsim.Backend) -> tuple[float, float, float]:
    """``(lambda per us, E[S] us, E[S^2] us^2)`` of *job_class*, the moments exact."""
    mean, second = job_class.service.moments_us(backend)
    return job_class.rho / float(mean), float(mean), float(second)


def make_workload(
    classes: Sequence[JobClass], requests: int, seed: np.random.SeedSequence
) -> Workload:
    """*requests* arrivals of the superposed Poisson streams of *classes*.

    The merged stream is Poisson at the total rate and each arrival's class is drawn
    independently with probability ``lambda_i / lambda``: the same process as
    independent streams per class, with an exact request count.
    """
    backend = make_backend()
    rates = np.array([moments(c, backend)[0] for c in classes])
    arrival_rng, class_rng, size_rng = (np.random.default_rng(s) for s in seed.spawn(3))
    arrivals = validation.poisson_arrivals_us(arrival_rng, float(rates.sum()), requests)
    labels = class_rng.choice(len(classes), size=requests, p=rates / rates.sum())
    prompts = np.zeros(requests, dtype=np.int64)
    outputs = np.zeros(requests, dtype=np.int64)
    services = np.zeros(requests, dtype=np.int64)
    for index, job_class in enumerate(classes):
        mask = labels == index
        model = job_class.service
        prompt, output = model.sample(size_rng, int(mask.sum()))
        costs = np.asarray(model.prefill_costs_us(backend), dtype=np.int64)
        prompts[mask], outputs[mask] = prompt, output
        services[mask] = costs[prompt - model.prompt_tokens[0]] + output * backend.decode_step_us(1)
    return Workload(arrivals, labels.astype(np.int64), prompts, outputs, services)


def simulate(
    workload: Workload, classes: Sequence[JobClass], scheduler: simsim.Scheduler
) -> tuple[Array, Array]:
    """Run *workload* through a single-slot engine; ``(admit_us, finish_us)`` per request."""
    engine = simsim.SimulationEngine(make_backend(), scheduler)
    for request_id, (arrival, label, prompt, output) in enumerate(
        zip(
            workload.arrivals_us.tolist(),
            workload.classes.tolist(),
            workload.prompts.tolist(),
            workload.outputs.tolist(),
            strict=True,
        )
    ):
        job_class = classes[label]
        engine.submit(
            simsim.Request(
                request_id,
                arrival,
                prompt,
                output,
                request_class=job_class.name,
                priority=job_class.priority,
            )
        )
    engine.run()
    frame = engine.requests_frame()
    if not (frame["state"] == "FINISHED").all():
        raise RuntimeError("not every request finished")
    return (
        frame["admit_time_us"].to_numpy(dtype=np.int64),
        frame["finish_time_us"].to_numpy(dtype=np.int64),
    )


def replay_admits(
    arrivals_us: Sequence[int], keys: Sequence[Any], services_us: Sequence[int]
) -> Array:
    """Admit times of a non-preemptive single server that, whenever it is free, serves
    the arrived request with the least ``(key, arrival, id)``.

    A request arriving at the very microsecond the server frees competes for it (the
    engine admits at the end of a timestamp, after that timestamp's arrivals).
    """
    count = len(arrivals_us)
    admits = [0] * count
    waiting: list[tuple[Any, int, int]] = []
    free_us = 0
    following = 0
    while following < count or waiting:
        if not waiting and arrivals_us[following] > free_us:
            free_us = arrivals_us[following]  # idle until the next arrival
        while following < count and arrivals_us[following] <= free_us:
            heapq.heappush(waiting, (keys[following], arrivals_us[following], following))
            following += 1
        _, _, chosen = heapq.heappop(waiting)
        admits[chosen] = free_us
        free_us += services_us[chosen]
    return np.asarray(admits, dtype=np.int64)


def observed(requests: int) -> slice:
    """The requests measured: after the warm-up (as in ``validation.py``), up to the last."""
    return slice(int(requests * validation.WARMUP_FRACTION), requests - 1)


def estimate(label: str, theory: float, values: Sequence[float], level: float) -> Estimate:
    """A ``validation.Estimate`` (us) of *label*: *theory* (``nan`` when there is none)
    against the Student-t interval of *values*."""
    mean, low, high = confidence_interval(values, level)
    quantity = validation.Quantity(label, label, "us", ",.0f")
    return Estimate(quantity, theory, mean, low, high)


# ------------------------------------------------------------------ Cobham's formula


@dataclass(frozen=True)
class Case:
    """Classes of requests on one slot, and a budget of replications x requests.

    ``aging_per_s`` is used by the shortest-job-first comparison only.
    """

    name: str
    classes: tuple[JobClass, ...]
    replications: int
    requests: int
    seed: int
    aging_per_s: float = 0.0

    @property
    def rho(self) -> float:
        return sum(c.rho for c in self.classes)


def residual_work_us(classes: Sequence[JobClass], backend: simsim.Backend) -> float:
    """``W0 = sum_i lambda_i E[S_i^2] / 2``: the mean remaining service an arrival finds."""
    return math.fsum(
        rate * second / 2 for rate, _, second in (moments(c, backend) for c in classes)
    )


def cobham_waits_us(classes: Sequence[JobClass], backend: simsim.Backend) -> dict[str, float]:
    """Each class's mean queue delay by Cobham's formula (classes sorted by priority)."""
    w0 = residual_work_us(classes, backend)
    waits: dict[str, float] = {}
    sigma = 0.0
    for job_class in sorted(classes, key=lambda c: c.priority):
        before, sigma = sigma, sigma + job_class.rho
        waits[job_class.name] = w0 / ((1 - before) * (1 - sigma))
    return waits


PRIORITY_CASES: tuple[Case, ...] = (
    Case(
        "two classes, rho 0.8: short interactive requests before long batch ones",
        (JobClass("interactive", 0, 0.3, SHORT), JobClass("batch", 1, 0.5, LONG)),
        replications=10,
        requests=40_000,
        seed=1701,
    ),
    Case(
        "three classes, rho 0.75: the most urgent class has the longest requests",
        (
            JobClass("urgent", 0, 0.25, LONG),
            JobClass("normal", 1, 0.25, MEDIUM),
            JobClass("background", 2, 0.25, SHORT),
        ),
        replications=10,
        requests=40_000,
        seed=1702,
    ),
)


@dataclass(frozen=True)
class PriorityResult:
    case: Case
    estimates: tuple[Estimate, ...]  # one per class, in the case's order
    fcfs_wait_us: float  # Pollaczek-Khinchine, the same arrivals served in order
    mismatches: int


def run_priority_case(case: Case, level: float) -> PriorityResult:
    """Replications of *case*; each class's mean queue delay against Cobham's formula."""
    backend = make_backend()
    per_class: list[list[float]] = [[] for _ in case.classes]
    mismatches = 0
    for seed in np.random.SeedSequence(case.seed).spawn(case.replications):
        workload = make_workload(case.classes, case.requests, seed)
        admits, _ = simulate(workload, case.classes, PriorityScheduler())
        priorities = [case.classes[label].priority for label in workload.classes.tolist()]
        replayed = replay_admits(
            workload.arrivals_us.tolist(), priorities, workload.services_us.tolist()
        )
        mismatches += int(np.count_nonzero(replayed != admits))
        window = observed(case.requests)
        delays = (admits - workload.arrivals_us)[window]
        labels = workload.classes[window]
        for index in range(len(case.classes)):
            per_class[index].append(float(delays[labels == index].mean()))
    theory = cobham_waits_us(case.classes, backend)
    estimates = tuple(
        estimate(c.name, theory[c.name], values, level)
        for c, values in zip(case.classes, per_class, strict=True)
    )
    fcfs = residual_work_us(case.classes, backend) / (1 - case.rho)
    return PriorityResult(case, estimates, fcfs, mismatches)


# ------------------------------------------------------------------ shortest job first


#: 90% of the requests short, 10% long (about 59% of the work), at rho = 0.9. Aging
#: forgives 50,000 us of predicted service per second of waiting: a long job (at most
#: 17,284 us) is admitted before anything that arrives more than 0.35 s after it.
SJF_CASE = Case(
    "short and long jobs, rho 0.9",
    (JobClass("short", 0, 0.37, SHORT), JobClass("long", 0, 0.53, LONG)),
    replications=10,
    requests=40_000,
    seed=1703,
    aging_per_s=50_000.0,
)


def service_distribution(classes: Sequence[JobClass], backend: simsim.Backend) -> dict[int, float]:
    """Service time (us) -> arrival rate (per us) of jobs with that service time."""
    rates: dict[int, float] = {}
    decode_us = backend.decode_step_us(1)
    for job_class in classes:
        rate = moments(job_class, backend)[0]
        prefills = job_class.service.prefill_costs_us(backend)
        low, high = job_class.service.output_tokens
        share = rate / (len(prefills) * (high - low + 1))
        for prefill_us in prefills:
            for tokens in range(low, high + 1):
                service = prefill_us + tokens * decode_us
                rates[service] = rates.get(service, 0.0) + share
    return rates


def sjf_wait_us(classes: Sequence[JobClass], backend: simsim.Backend) -> dict[int, float]:
    """Service time -> its mean queue delay under non-preemptive shortest job first."""
    w0 = residual_work_us(classes, backend)
    waits: dict[int, float] = {}
    below = 0.0  # rho(<x)
    for service, rate in sorted(service_distribution(classes, backend).items()):
        upto = below + rate * service  # rho(<=x)
        waits[service] = w0 / ((1 - below) * (1 - upto))
        below = upto
    return waits


@dataclass(frozen=True)
class SjfTheory:
    """Mean queue delay and mean response time (us) of FCFS and of exact-size SJF."""

    fcfs_wait_us: float
    sjf_wait_us: float
    mean_service_us: float


def sjf_theory(case: Case, backend: simsim.Backend) -> SjfTheory:
    rates = service_distribution(case.classes, backend)
    total = math.fsum(rates.values())
    mean_service = math.fsum(s * r for s, r in rates.items()) / total
    waits = sjf_wait_us(case.classes, backend)
    sjf = math.fsum(rates[s] * w for s, w in waits.items()) / total
    fcfs = residual_work_us(case.classes, backend) / (1 - case.rho)
    return SjfTheory(fcfs, sjf, mean_service)


def exact_size(backend: simsim.Backend) -> Callable[[simsim.QueuedRequest], int]:
    """A predictor that knows each request's service time on the single slot."""
    decode_us = backend.decode_step_us(1)

    def predict(item: simsim.QueuedRequest) -> int:
        return backend.prefill_us(item.prompt_token_count, 1) + item.max_output_tokens * decode_us

    return predict


#: The policies compared, by label: a scheduler factory and the replay's order key.
POLICIES = ("fcfs", "sjf", "sjf+aging")


def policy(
    name: str, case: Case, backend: simsim.Backend
) -> tuple[Callable[[], simsim.Scheduler], Callable[[int, int], float]]:
    """``(new scheduler, key(arrival_us, service_us))`` of policy *name*."""
    predict = exact_size(backend)
    if name == "fcfs":
        return simsim.FcfsScheduler, lambda arrival, service: 0
    if name == "sjf":
        return lambda: ShortestJobFirstScheduler(predict=predict), lambda arrival, service: service
    us_per_size = 1_000_000 / case.aging_per_s
    return (
        lambda: ShortestJobFirstScheduler(aging_per_s=case.aging_per_s, predict=predict),
        lambda arrival, service: arrival + service * us_per_size,
    )


@dataclass(frozen=True)
class PolicyResult:
    """One policy over the replications (us): interval of mean wait, pooled percentiles."""

    name: str
    wait: Estimate
    response: Estimate
    response_p99_us: float
    long_response_p99_us: float
    long_response_max_us: float
    mismatches: int


@dataclass(frozen=True)
class SjfResult:
    case: Case
    theory: SjfTheory
    policies: dict[str, PolicyResult]


def run_sjf_case(case: Case, level: float, policies: Sequence[str] = POLICIES) -> SjfResult:
    """Each policy on the same arrivals (common random numbers), replications pooled."""
    backend = make_backend()
    theory = sjf_theory(case, backend)
    long_index = [c.name for c in case.classes].index("long")
    samples: dict[str, dict[str, list[Any]]] = {
        name: {"wait": [], "response": [], "all": [], "long": [], "mismatches": []}
        for name in policies
    }
    for seed in np.random.SeedSequence(case.seed).spawn(case.replications):
        workload = make_workload(case.classes, case.requests, seed)
        window = observed(case.requests)
        arrivals, services = workload.arrivals_us.tolist(), workload.services_us.tolist()
        for name in policies:
            factory, key = policy(name, case, backend)
            admits, finishes = simulate(workload, case.classes, factory())
            keys = [key(a, s) for a, s in zip(arrivals, services, strict=True)]
            replayed = replay_admits(arrivals, keys, services)
            response = (finishes - workload.arrivals_us)[window]
            record = samples[name]
            record["mismatches"].append(int(np.count_nonzero(replayed != admits)))
            record["wait"].append(float((admits - workload.arrivals_us)[window].mean()))
            record["response"].append(float(response.mean()))
            record["all"].append(response)
            record["long"].append(response[workload.classes[window] == long_index])
    theory_wait = {"fcfs": theory.fcfs_wait_us, "sjf": theory.sjf_wait_us}
    results = {}
    for name, record in samples.items():
        wait_theory = theory_wait.get(name, math.nan)
        responses, longs = np.concatenate(record["all"]), np.concatenate(record["long"])
        results[name] = PolicyResult(
            name,
            estimate("mean queue delay", wait_theory, record["wait"], level),
            estimate(
                "mean response", wait_theory + theory.mean_service_us, record["response"], level
            ),
            float(np.percentile(responses, 99)),
            float(np.percentile(longs, 99)),
            float(longs.max()),
            sum(record["mismatches"]),
        )
    return SjfResult(case, theory, results)


#: Intervals in the family: one per class of every priority case, and the mean queue
#: delay and mean response of FCFS and SJF (the policies with a closed form).
FAMILY_SIZE = sum(len(case.classes) for case in PRIORITY_CASES) + 4
LEVEL = 1.0 - (1.0 - FAMILY_LEVEL) / FAMILY_SIZE


# ------------------------------------------------------------------ report


def render_priority(result: PriorityResult) -> str:
    case = result.case
    lines = [
        f"### {case.name}",
        "",
        f"{case.replications} replications x {case.requests:,} requests "
        f"(first {int(case.requests * validation.WARMUP_FRACTION):,} discarded), seed "
        f"{case.seed}; FCFS would give every class {result.fcfs_wait_us:,.0f} us; "
        f"replay mismatches: {result.mismatches}.",
        "",
        "| class | priority | rho | E[S] (us) | Cobham W (us) | simulated mean (us) "
        f"| {LEVEL:.2%} CI (us) | inside |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    backend = make_backend()
    for job_class, est in zip(case.classes, result.estimates, strict=True):
        mean_service = moments(job_class, backend)[1]
        lines.append(
            f"| {job_class.name} | {job_class.priority} | {job_class.rho:g} "
            f"| {mean_service:,.0f} | {est.theory:,.0f} | {est.mean:,.0f} "
            f"| [{est.low:,.0f}, {est.high:,.0f}] | {'yes' if est.inside else '**NO**'} |"
        )
    return "\n".join(lines) + "\n"


def render_sjf(result: SjfResult) -> str:
    case = result.case

    def number(value: float) -> str:
        return "-" if math.isnan(value) else f"{value / 1e3:,.1f}"

    lines = [
        f"### FCFS, shortest job first and aging at rho = {case.rho:g}",
        "",
        f"{case.replications} replications x {case.requests:,} requests, seed {case.seed}; "
        f"classes: {', '.join(f'{c.name} (rho {c.rho:g})' for c in case.classes)}; "
        f"aging {case.aging_per_s:,.0f} us of service forgiven per second. Times in ms.",
        "",
        "| policy | theory mean response | simulated mean response | CI "
        "| p99 response | long jobs' p99 | long jobs' max | replay mismatches |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, policy_result in result.policies.items():
        est = policy_result.response
        lines.append(
            f"| {name} | {number(est.theory)} | {number(est.mean)} "
            f"| [{number(est.low)}, {number(est.high)}] | {number(policy_result.response_p99_us)} "
            f"| {number(policy_result.long_response_p99_us)} "
            f"| {number(policy_result.long_response_max_us)} | {policy_result.mismatches} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> tuple[list[PriorityResult], SjfResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 replications of a twentieth of the requests (the smoke test)",
    )
    args = parser.parse_args(argv)

    def sized(case: Any) -> Any:
        return replace(case, requests=case.requests // 20, replications=3) if args.quick else case

    priority_results = []
    for case in PRIORITY_CASES:
        result = run_priority_case(sized(case), LEVEL)
        priority_results.append(result)
        print(render_priority(result))
    sjf_result = run_sjf_case(sized(SJF_CASE), LEVEL)
    print(render_sjf(sjf_result))
    print("Simulated time from the cost model, not measured on any hardware.")
    return priority_results, sjf_result


if __name__ == "__main__":
    main()
