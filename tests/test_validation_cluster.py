"""Clusters of single-slot replicas against queueing theory (docs/validation.md, "Clusters").

Poisson arrivals, service times that are exponential rounded down to whole microseconds,
``c`` single-slot replicas behind a router. Random routing splits the Poisson stream, so
every replica is M/G/1 (Pollaczek-Khinchine); round robin gives every replica Erlang-c
interarrival times (E_c/M/1, by the GI/M/1 root); join-the-shortest-queue
(``least_outstanding``) is compared with the exact Markov chain of its sorted queue
lengths, and shown to lie between M/M/c (a central queue) and round robin. Independent
replications from fixed seeds give Student-t intervals; every replica is also replayed
through Lindley's recursion and must agree exactly.

The machinery lives in ``benchmarks/validation.py``. The suite runs each documented case
with a tenth of its requests per replication (``QUICK_REQUESTS_DIVISOR``);
``SIMSIM_EXHAUSTIVE=1`` runs them at full size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest
from helpers import EXHAUSTIVE, ROOT, load_script

validation = load_script(ROOT / "benchmarks" / "validation.py", "simsim_benchmarks_validation")
CASE_IDS = [case.name for case in validation.CLUSTER_CASES]
JSQ_IDS = [case.name for case in validation.CLUSTER_CASES if case.router == "least_outstanding"]

#: A tenth of the documented requests per replication (same load, seeds, replications
#: and level): the exact Lindley and routing checks are as strict, the intervals about
#: three times as wide as the documented ones, still far narrower than the gaps
#: between the routers.
QUICK_REQUESTS_DIVISOR = 1 if EXHAUSTIVE else 10


@functools.cache
def _result(name: str) -> Any:
    """Each case runs once per session, however many tests read it."""
    (case,) = [case for case in validation.CLUSTER_CASES if case.name == name]
    case = dataclasses.replace(case, requests=case.requests // QUICK_REQUESTS_DIVISOR)
    return validation.run_cluster_case(case)


# ---------------------------------------------------------------- the design itself


def test_cases_cover_the_three_routers_at_one_load() -> None:
    routers = {case.router for case in validation.CLUSTER_CASES}
    assert routers == {"random", "round_robin", "least_outstanding"}
    assert {case.rho for case in validation.CLUSTER_CASES} == {0.7}
    assert max(case.replicas for case in validation.CLUSTER_CASES) >= 16
    assert len(set(CASE_IDS)) == len(CASE_IDS)
    assert len({case.seed for case in validation.CLUSTER_CASES}) == len(CASE_IDS)


def test_service_is_a_geometric_distribution_with_exact_moments() -> None:
    service = validation.GeometricService(50.0)
    q = math.exp(-1 / 50)
    # P(S = k) = (1 - q) q^k; the tail beyond 5,000 is below 1e-40.
    mean = sum(k * (1 - q) * q**k for k in range(5_000))
    second = sum(k * k * (1 - q) * q**k for k in range(5_000))
    assert service.moments_us() == pytest.approx((mean, second), rel=1e-12)
    # Rounding an exponential down loses half a microsecond on average, no more.
    mean_us, second_us2 = validation.CLUSTER_SERVICE.moments_us()
    scale = validation.CLUSTER_SERVICE.scale_us
    assert scale - 0.5 < mean_us < scale
    assert second_us2 / mean_us**2 == pytest.approx(2.0, rel=1e-3)  # as exponential's
    backend = validation.simsim.SimulatedBackend(validation.CLUSTER_BACKEND_CONFIG)
    assert [backend.prefill_us(p, 1) for p in (0, 1, 1234)] == [0, 1, 1234]


def test_formulas_agree_with_known_cases() -> None:
    # One replica: M/M/c, E_1/M/1, the JSQ chain and Pollaczek-Khinchine are all M/M/1.
    rate, mean = 0.6 / 1000, 1000.0
    mm1 = 0.6 * mean / (1 - 0.6)
    assert validation.mmc_queue_delay_us(1, rate, mean) == pytest.approx(mm1)
    assert validation.erlang_arrivals_queue_delay_us(1, rate, mean) == pytest.approx(mm1)
    jsq, blocking = validation.jsq_queue_delay_us(1, rate, mean, 80)
    assert jsq == pytest.approx(mm1, rel=1e-9) and blocking < 1e-15
    # Erlang C: two servers offered one erlang wait with probability 1/3.
    assert validation.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # E_k/M/1's root solves its own equation, and rounder arrivals wait less.
    theory = validation.ClusterTheory(4, 4 * 0.7 / mean, mean, 2 * mean**2)
    assert theory.rho == pytest.approx(0.7)
    assert theory.mmc_queue_delay_us < theory.round_robin_queue_delay_us
    assert theory.round_robin_queue_delay_us < theory.random_queue_delay_us
    assert theory.random_queue_delay_us == pytest.approx(0.7 * mean / 0.3)
    assert theory.mmc_queue_delay_us < theory.jsq()[0] < theory.round_robin_queue_delay_us


def test_jsq_chain_truncation_changes_nothing_measurable() -> None:
    rate, mean = 4 * 0.7 / 1000, 1000.0
    coarse, coarse_blocking = validation.jsq_queue_delay_us(4, rate, mean, 10)
    fine, fine_blocking = validation.jsq_queue_delay_us(4, rate, mean, 12)
    # At a blocking probability below 1e-6 the wait has settled to well under 0.1 us
    # (the cases' truncations block below 1e-8).
    assert fine_blocking < coarse_blocking < 1e-6
    assert fine == pytest.approx(coarse, abs=0.05)  # microseconds


# ---------------------------------------------------------------- the validation


@pytest.mark.parametrize("name", CASE_IDS)
def test_every_replica_follows_lindley_and_its_routes_exactly(name: str) -> None:
    result = _result(name)
    assert result.lindley_mismatches == 0
    assert result.routing_mismatches == 0
    assert len(result.replications) == result.case.replications


@pytest.mark.parametrize("name", CASE_IDS)
def test_mean_queue_delay_matches_theory(name: str) -> None:
    estimate = _result(name).estimate
    assert estimate.low <= estimate.theory <= estimate.high, f"{name}: {estimate.describe()}"


@pytest.mark.parametrize("name", JSQ_IDS)
def test_jsq_lies_between_a_central_queue_and_round_robin(name: str) -> None:
    result = _result(name)
    estimate, theory = result.estimate, result.theory
    assert theory.mmc_queue_delay_us < estimate.low, estimate.describe()
    assert estimate.high < theory.round_robin_queue_delay_us, estimate.describe()


def test_round_robin_waits_less_than_random_routing() -> None:
    (random_name,) = [name for name in CASE_IDS if name.startswith("random-")]
    (robin_name,) = [name for name in CASE_IDS if name.startswith("round_robin-")]
    assert _result(robin_name).estimate.high < _result(random_name).estimate.low


# ---------------------------------------------------------------- tooling, on a tiny case


def test_cluster_table_rendering() -> None:
    tiny = validation.ClusterCase("least_outstanding", 3, 0.5, replications=2, requests=200, seed=5)
    result = validation.run_cluster_case(tiny)
    again = validation.run_cluster_case(tiny)
    assert result.replications == again.replications  # fixed seeds, same numbers
    block = validation.render_cluster_table([result])
    rows = [line for line in block.splitlines() if line.startswith("| least_outstanding |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[:4] == ["least_outstanding", "3", "0.5", "JSQ, exact Markov chain"]
    assert cells[7] in {"yes", "**NO**"}
    assert cells[-2:] == ["2 x 200", "0 / 0"]
    assert "JSQ with c = 3: chain truncated at" in block
    document = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert validation.CLUSTER_BEGIN_MARKER in document
    assert validation.BEGIN_MARKER in document
    updated = validation.replace_generated_block(
        document, block, validation.CLUSTER_BEGIN_MARKER, validation.CLUSTER_END_MARKER
    )
    # The single slot's generated block is untouched; only the cluster block changes.
    single = document.split(validation.BEGIN_MARKER)[1].split(validation.END_MARKER)[0]
    assert single in updated
    assert block.strip() in updated
    assert (
        validation.replace_generated_block(
            updated, block, validation.CLUSTER_BEGIN_MARKER, validation.CLUSTER_END_MARKER
        )
        == updated
    )
