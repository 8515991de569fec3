"""The single slot with PriorityScheduler and ShortestJobFirstScheduler against queueing
theory (see docs/validation.md, "Priority classes").

Poisson arrivals of independent classes on ``SimulationEngine`` make an M/G/1 queue;
the scheduler picks the service order. Cobham's formula gives each priority class's
mean queue delay, and the non-preemptive shortest-job-first formula the mean delay of a
job of each size. Replications from fixed seeds give Student-t intervals (Bonferroni
over the family) that must contain the theory, and every replication is replayed by a
plain priority-queue loop whose admit times the engine must match exactly. The
machinery is ``benchmarks/schedulers.py``, imported by path; the suite runs a quarter
of its requests per replication (``SIMSIM_EXHAUSTIVE=1``: all of them).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import pytest
from helpers import EXHAUSTIVE, ROOT, load_script

import simsim

schedulers = load_script(ROOT / "benchmarks" / "schedulers.py", "simsim_benchmarks_schedulers")
JobClass = schedulers.JobClass

QUICK_REQUESTS_DIVISOR = 1 if EXHAUSTIVE else 4
CASE_CLASSES = [
    (index, job_class.name)
    for index, case in enumerate(schedulers.PRIORITY_CASES)
    for job_class in case.classes
]


@functools.cache
def _priority_result(index: int) -> Any:
    """Each priority case runs once per session, however many tests read it."""
    case = schedulers.PRIORITY_CASES[index]
    case = dataclasses.replace(case, requests=case.requests // QUICK_REQUESTS_DIVISOR)
    return schedulers.run_priority_case(case, schedulers.LEVEL)


@functools.cache
def _sjf_result() -> Any:
    case = schedulers.SJF_CASE
    case = dataclasses.replace(case, requests=case.requests // QUICK_REQUESTS_DIVISOR)
    return schedulers.run_sjf_case(case, schedulers.LEVEL, policies=("sjf",))


def _point(name: str, prompt: int, rho: float, priority: int = 0) -> Any:
    """A class whose every request has *prompt* tokens and one output token."""
    return JobClass(
        name, priority, rho, schedulers.ServiceModel(name, "", (prompt, prompt), (1, 1))
    )


# ---------------------------------------------------------------- the formulas


def test_cobham_matches_a_hand_computation_and_conserves_work() -> None:
    backend = schedulers.make_backend()
    # Service 100 + 4 p + 400: 1,000 us for p = 125, 2,000 us for p = 375.
    fast, slow = _point("fast", 125, 0.2, priority=1), _point("slow", 375, 0.4, priority=0)
    w0 = (0.2 / 1000) * 1000**2 / 2 + (0.4 / 2000) * 2000**2 / 2  # 100 + 400
    waits = schedulers.cobham_waits_us([fast, slow], backend)
    assert waits["slow"] == pytest.approx(w0 / (1 * 0.6))  # served first
    assert waits["fast"] == pytest.approx(w0 / (0.6 * 0.4))
    # Kleinrock's conservation law: the work-weighted wait equals FCFS's.
    fcfs = schedulers.residual_work_us([fast, slow], backend) / (1 - 0.6)
    assert 0.2 * waits["fast"] + 0.4 * waits["slow"] == pytest.approx(0.6 * fcfs)
    for case in schedulers.PRIORITY_CASES:
        waits = schedulers.cobham_waits_us(case.classes, backend)
        fcfs = schedulers.residual_work_us(case.classes, backend) / (1 - case.rho)
        weighted = math.fsum(c.rho * waits[c.name] for c in case.classes)
        assert weighted == pytest.approx(case.rho * fcfs)
        by_priority = [waits[c.name] for c in sorted(case.classes, key=lambda c: c.priority)]
        assert by_priority == sorted(by_priority)


def test_sjf_formula_reduces_to_fcfs_for_one_size_and_conserves_work() -> None:
    backend = schedulers.make_backend()
    one_size = dataclasses.replace(schedulers.SJF_CASE, classes=(_point("only", 1024, 0.9),))
    theory = schedulers.sjf_theory(one_size, backend)
    assert theory.sjf_wait_us == pytest.approx(theory.fcfs_wait_us)
    assert theory.mean_service_us == 4596
    # A mix: longer jobs wait longer, and the work-weighted wait equals FCFS's.
    classes = schedulers.SJF_CASE.classes
    waits = schedulers.sjf_wait_us(classes, backend)
    assert list(waits.values()) == sorted(waits.values())
    rates = schedulers.service_distribution(classes, backend)
    load = math.fsum(rate * service for service, rate in rates.items())
    assert load == pytest.approx(schedulers.SJF_CASE.rho)
    weighted = math.fsum(rates[s] * s * waits[s] for s in rates)
    theory = schedulers.sjf_theory(schedulers.SJF_CASE, backend)
    assert weighted == pytest.approx(load * theory.fcfs_wait_us)
    assert theory.sjf_wait_us < theory.fcfs_wait_us / 3


def test_replay_serves_the_least_key_and_lets_a_same_time_arrival_compete() -> None:
    # Request 0 runs at once; when it ends at 10, request 2 (key 1) beats request 1.
    admits = schedulers.replay_admits([0, 1, 2], [5, 9, 1], [10, 10, 10])
    assert admits.tolist() == [0, 20, 10]
    # Request 2 arrives as request 0 ends, and its smaller key wins.
    admits = schedulers.replay_admits([0, 5, 10], [0, 2, 1], [10, 4, 3])
    assert admits.tolist() == [0, 13, 10]
    # Ties fall to arrival, then id; an idle server waits for the next arrival.
    admits = schedulers.replay_admits([0, 0, 50], [1, 1, 0], [5, 5, 5])
    assert admits.tolist() == [0, 5, 50]


def test_the_exact_check_has_teeth() -> None:
    case = schedulers.PRIORITY_CASES[0]
    workload = schedulers.make_workload(case.classes, 500, np.random.SeedSequence(5))
    admits, _ = schedulers.simulate(workload, case.classes, simsim.FcfsScheduler())
    arrivals, services = workload.arrivals_us.tolist(), workload.services_us.tolist()
    priorities = [case.classes[label].priority for label in workload.classes.tolist()]
    assert (schedulers.replay_admits(arrivals, [0] * 500, services) == admits).all()
    assert (schedulers.replay_admits(arrivals, priorities, services) != admits).any()


# ---------------------------------------------------------------- the validation


@pytest.mark.parametrize("index", range(len(schedulers.PRIORITY_CASES)))
def test_priority_engine_admits_exactly_as_the_replay(index: int) -> None:
    result = _priority_result(index)
    assert result.mismatches == 0
    assert len(result.estimates) == len(result.case.classes)


@pytest.mark.parametrize(("index", "name"), CASE_CLASSES)
def test_class_mean_queue_delay_matches_cobham(index: int, name: str) -> None:
    result = _priority_result(index)
    (estimate,) = [e for e in result.estimates if e.quantity.label == name]
    assert estimate.inside, f"{result.case.name}: {estimate.describe()}"


def test_sjf_mean_queue_delay_and_response_match_the_formula_and_beat_fcfs() -> None:
    result = _sjf_result()
    sjf = result.policies["sjf"]
    assert sjf.mismatches == 0
    assert sjf.wait.inside, sjf.wait.describe()
    assert sjf.response.inside, sjf.response.describe()
    # FCFS's Pollaczek-Khinchine wait is far above SJF's whole interval.
    assert sjf.wait.high < result.theory.fcfs_wait_us / 2
