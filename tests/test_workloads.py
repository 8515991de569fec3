"""Seeded workload generators: statistics, determinism, stream independence, engine runs."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import simsim
from simsim.traces import TraceError
from simsim.workloads import (
    ClosedLoopWorkload,
    Empirical,
    Exponential,
    Fixed,
    FixedRateArrivals,
    GammaArrivals,
    LogNormal,
    OpenLoopWorkload,
    PatienceDeadline,
    PoissonArrivals,
    Uniform,
    check_seed,
    submit_with_deadlines,
)

COUNT = 20_000


def rng(seed: int = 2024) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def mean_and_cv(values: npt.NDArray[Any]) -> tuple[float, float]:
    data = values.astype(np.float64)
    mean = float(data.mean())
    return mean, float(data.std()) / mean


def gaps_of(times: npt.NDArray[np.int64], start_us: int = 0) -> npt.NDArray[np.int64]:
    return np.diff(np.concatenate(([start_us], times)))


def fields(requests: tuple[simsim.Request, ...]) -> list[tuple[int, int, int, int]]:
    return [
        (r.request_id, r.arrival_time_us, r.prompt_token_count, r.max_output_tokens)
        for r in requests
    ]


# ---------------------------------------------------------------------- arrival statistics


def test_poisson_gaps_have_the_rate_and_cv_one() -> None:
    times = PoissonArrivals(rate_per_s=100).arrival_times_us(rng(), COUNT)
    assert times.dtype == np.int64 and times.shape == (COUNT,)
    assert np.all(np.diff(times) >= 0)
    mean, cv = mean_and_cv(gaps_of(times))
    assert mean == pytest.approx(10_000, rel=0.02)
    assert cv == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 3.0])
def test_gamma_gaps_have_the_rate_and_the_chosen_cv(cv: float) -> None:
    times = GammaArrivals(rate_per_s=50, cv=cv).arrival_times_us(rng(), COUNT)
    assert np.all(np.diff(times) >= 0)
    mean, sample_cv = mean_and_cv(gaps_of(times))
    assert mean == pytest.approx(20_000, rel=0.04)
    assert sample_cv == pytest.approx(cv, rel=0.06)


def test_bursty_gamma_clusters_more_than_poisson() -> None:
    poisson = gaps_of(PoissonArrivals(50).arrival_times_us(rng(), COUNT))
    bursty = gaps_of(GammaArrivals(50, cv=3).arrival_times_us(rng(), COUNT))
    # Most bursty gaps are much shorter than the mean, balanced by a few very long lulls.
    assert np.mean(bursty < 2_000) > 2 * np.mean(poisson < 2_000)
    assert bursty.max() > 3 * poisson.max()


def test_fixed_rate_gaps_are_exactly_the_period() -> None:
    times = FixedRateArrivals(rate_per_s=250).arrival_times_us(rng(), COUNT, start_us=7)
    assert times[0] == 7 + 4_000
    gaps = gaps_of(times, 7)
    assert set(gaps.tolist()) == {4_000}
    assert mean_and_cv(gaps) == (4_000.0, 0.0)


def test_fixed_rate_rounds_each_time_not_each_gap() -> None:
    times = FixedRateArrivals(rate_per_s=3).arrival_times_us(rng(), 6)
    assert times.tolist() == [333_333, 666_667, 1_000_000, 1_333_333, 1_666_667, 2_000_000]
    # A period of 2.5 us: halves round to the even neighbour (numpy.rint).
    assert FixedRateArrivals(400_000).arrival_times_us(rng(), 4).tolist() == [2, 5, 8, 10]


def test_arrivals_start_after_start_us_and_accept_zero_count() -> None:
    for process in (PoissonArrivals(10), GammaArrivals(10, 2), FixedRateArrivals(10)):
        assert process.arrival_times_us(rng(), 0).tolist() == []
        times = process.arrival_times_us(rng(), 100, start_us=1_000_000)
        assert times.min() >= 1_000_000
        assert type(int(times[0])) is int


def test_arrivals_past_the_64_bit_range_raise_overflow() -> None:
    with pytest.raises(OverflowError, match="64-bit"):
        FixedRateArrivals(1e-13).arrival_times_us(rng(), 10)
    with pytest.raises(OverflowError, match="64-bit"):
        FixedRateArrivals(1).arrival_times_us(rng(), 3, start_us=2**63 - 2_000_000)


@pytest.mark.parametrize("cv", [1e300, 1e-300, 2e154, 5e-155])
def test_gamma_cv_whose_square_leaves_the_float_range_is_refused(cv: float) -> None:
    # 1 / cv**2 was a ZeroDivisionError at the first draw.
    with pytest.raises(ValueError, match=r"cv = .* is out of range: .*1/cv\*\*2"):
        GammaArrivals(1.0, cv)


def test_gamma_cv_at_the_edges_of_the_float_range_still_draws() -> None:
    for cv in (1e-150, 1e150):
        times = GammaArrivals(1.0, cv).arrival_times_us(rng(), 3)
        assert times.dtype == np.int64 and len(times) == 3


def test_gamma_rate_and_cv_with_an_infinite_scale_are_refused() -> None:
    with pytest.raises(ValueError, match="infinite gamma scale"):
        GammaArrivals(1e-300, 100.0)


# ---------------------------------------------------------------------- lengths


@pytest.mark.parametrize("cv", [1e308, 2e154])
def test_lognormal_cv_whose_square_is_infinite_is_refused(cv: float) -> None:
    # log(1 + cv**2) was infinite, every draw NaN, and the counts the int64 minimum.
    with pytest.raises(ValueError, match=r"cv = .* is out of range: cv\*\*2 must be a finite"):
        LogNormal(100, cv)


def test_lognormal_with_a_huge_but_finite_cv_gives_non_negative_counts() -> None:
    values = LogNormal(100, 1e150).sample(rng(), 1_000)
    assert values.min() >= 0


def test_empirical_weights_whose_sum_overflows_are_refused() -> None:
    with pytest.raises(ValueError, match="weights must have a finite sum"):
        Empirical((1, 2), weights=(1e308, 1e308))


def test_fixed_is_constant() -> None:
    values = Fixed(42).sample(rng(), 1_000)
    assert values.dtype == np.int64
    assert set(values.tolist()) == {42}


def test_uniform_is_inclusive_with_the_right_mean_and_cv() -> None:
    values = Uniform(10, 20).sample(rng(), COUNT)
    assert values.min() == 10 and values.max() == 20
    assert set(values.tolist()) == set(range(10, 21))
    mean, cv = mean_and_cv(values)
    assert mean == pytest.approx(15, rel=0.01)
    assert cv == pytest.approx(math.sqrt(10) / 15, rel=0.03)
    assert Uniform(5, 5).sample(rng(), 3).tolist() == [5, 5, 5]


@pytest.mark.parametrize(("mean", "cv"), [(500, 0.8), (2_000, 1.5), (50, 0.2)])
def test_lognormal_has_its_mean_and_cv(mean: float, cv: float) -> None:
    values = LogNormal(mean, cv).sample(rng(), COUNT)
    assert values.dtype == np.int64 and values.min() >= 0
    sample_mean, sample_cv = mean_and_cv(values)
    assert sample_mean == pytest.approx(mean, rel=0.04)
    assert sample_cv == pytest.approx(cv, rel=0.1)


def test_lognormal_is_clipped_and_cv_zero_is_the_mean() -> None:
    values = LogNormal(1_000, 2.0, low=100, high=1_500).sample(rng(), COUNT)
    assert values.min() == 100 and values.max() == 1_500
    assert set(LogNormal(7.5, 0).sample(rng(), 10).tolist()) == {8}  # 7.5 ties to even


def test_exponential_has_its_mean_and_cv_one() -> None:
    mean, cv = mean_and_cv(Exponential(100_000).sample(rng(), COUNT))
    assert mean == pytest.approx(100_000, rel=0.02)
    assert cv == pytest.approx(1.0, rel=0.03)
    assert Exponential(10, low=3, high=12).sample(rng(), COUNT).min() == 3


def test_empirical_follows_its_weights() -> None:
    values = Empirical((1, 2, 10), weights=(1, 1, 2)).sample(rng(), COUNT)
    assert set(values.tolist()) == {1, 2, 10}
    assert np.mean(values == 10) == pytest.approx(0.5, abs=0.015)
    assert float(values.mean()) == pytest.approx((1 + 2 + 20) / 4, rel=0.02)
    repeated = Empirical([3, 3, 3, 9]).sample(rng(), COUNT)
    assert np.mean(repeated == 3) == pytest.approx(0.75, abs=0.015)


def test_empirical_from_csv(tmp_path: Path) -> None:
    table = tmp_path / "lengths.csv"
    table.write_text("prompt,weight,other\n100,1,x\n\n200,3,y\n")
    plain = Empirical.from_csv(table, "prompt")
    assert plain.values == (100, 200) and plain.weights is None
    weighted = Empirical.from_csv(table, "prompt", weight_column="weight")
    assert weighted.weights == (1.0, 3.0)
    assert np.mean(weighted.sample(rng(), COUNT) == 200) == pytest.approx(0.75, abs=0.015)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("prompt\n", "header but no rows"),
        ("other\n1\n", "missing columns \\[.prompt.\\]"),
        ("prompt\n10\n-5\n", "line 3, column prompt: .*negative"),
        ("prompt\n10\n\n2.5\n", "line 4, column prompt: .*not an integer"),
    ],
)
def test_empirical_from_csv_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    table = tmp_path / "bad.csv"
    table.write_text(text)
    with pytest.raises(TraceError, match=message):
        Empirical.from_csv(table, "prompt")


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: PoissonArrivals(0), ValueError, "rate_per_s must be a finite number > 0"),
        (lambda: PoissonArrivals(-1.0), ValueError, "rate_per_s"),
        (lambda: PoissonArrivals(math.inf), ValueError, "rate_per_s must be a finite number"),
        (lambda: PoissonArrivals("5"), TypeError, "rate_per_s"),
        (lambda: PoissonArrivals(True), TypeError, "rate_per_s"),
        (lambda: GammaArrivals(1, 0), ValueError, "cv must be a finite number > 0"),
        (lambda: GammaArrivals(1, math.nan), ValueError, "cv"),
        (lambda: FixedRateArrivals(0), ValueError, "rate_per_s"),
        (lambda: Fixed(-1), ValueError, "value must be >= 0"),
        (lambda: Fixed(1.5), TypeError, "value"),
        (lambda: Uniform(5, 4), ValueError, "high must be >= low"),
        (lambda: Uniform(-1, 4), ValueError, "low"),
        (lambda: LogNormal(0, 1), ValueError, "mean must be a finite number > 0"),
        (lambda: LogNormal(10, -1), ValueError, "cv must be a finite number >= 0"),
        (lambda: LogNormal(10, 1, low=5, high=4), ValueError, "high must be >= low"),
        (lambda: Exponential(-3), ValueError, "mean"),
        (lambda: Empirical(()), ValueError, "at least one value"),
        (lambda: Empirical((1, -2)), ValueError, r"values\[1\]"),
        (lambda: Empirical("12"), TypeError, "values"),
        (lambda: Empirical((1, 2), weights=(1,)), ValueError, "one entry per value"),
        (lambda: Empirical((1, 2), weights=(0, 0)), ValueError, "positive sum"),
        (lambda: Empirical((1, 2), weights=(1, -1)), ValueError, r"weights\[1\]"),
        (
            lambda: OpenLoopWorkload(Fixed(1), Fixed(1), Fixed(1), count=1),  # type: ignore[arg-type]
            TypeError,
            "arrivals",
        ),
        (
            lambda: OpenLoopWorkload(PoissonArrivals(1), (1, 2), Fixed(1), count=1),  # type: ignore[arg-type]
            TypeError,
            "prompt_tokens",
        ),
        (
            lambda: OpenLoopWorkload(PoissonArrivals(1), Fixed(1), Fixed(1), count=-1),
            ValueError,
            "count must be >= 1, got -1",
        ),
        # A workload of no request is refused as users = 0 is: an empty run is a mistake.
        (
            lambda: OpenLoopWorkload(PoissonArrivals(1), Fixed(1), Fixed(1), count=0),
            ValueError,
            "^count must be >= 1, got 0$",
        ),
        # Sizes no run could hold are refused before anything is drawn.
        (
            lambda: OpenLoopWorkload(PoissonArrivals(1), Fixed(1), Fixed(1), count=10**12),
            ValueError,
            r"^count must be at most 10,000,000 \(every request is held in memory, about 1 GB "
            r"per million\), got 1,000,000,000,000$",
        ),
        (
            lambda: ClosedLoopWorkload(10**8, Fixed(0), Fixed(1), Fixed(1), horizon_us=5),
            ValueError,
            "users must be at most 10,000,000",
        ),
        (
            lambda: ClosedLoopWorkload(
                1_000, Fixed(0), Fixed(1), Fixed(1), requests_per_user=1_000_000
            ),
            ValueError,
            r"users \* requests_per_user = 1,000 \* 1,000,000 requests, more than the limit of "
            "10,000,000 per workload",
        ),
        (
            lambda: OpenLoopWorkload(PoissonArrivals(1), Fixed(1), Fixed(1), 1, patience=5),  # type: ignore[arg-type]
            TypeError,
            "patience",
        ),
        (
            lambda: ClosedLoopWorkload(0, Fixed(0), Fixed(1), Fixed(1), requests_per_user=1),
            ValueError,
            "users must be >= 1",
        ),
        (
            lambda: ClosedLoopWorkload(1, Fixed(0), Fixed(1), Fixed(1)),
            ValueError,
            "exactly one of requests_per_user and horizon_us",
        ),
        (
            lambda: ClosedLoopWorkload(
                1, Fixed(0), Fixed(1), Fixed(1), requests_per_user=1, horizon_us=5
            ),
            ValueError,
            "exactly one",
        ),
        (
            lambda: ClosedLoopWorkload(1, Fixed(0), Fixed(1), Fixed(1), horizon_us=1.5),
            TypeError,
            "horizon_us",
        ),
        (
            lambda: ClosedLoopWorkload(1, Fixed(0), Fixed(1), Fixed(1), horizon_us=0),
            ValueError,
            "horizon_us must be >= 1, got 0",
        ),
        (
            lambda: ClosedLoopWorkload(1, 100, Fixed(1), Fixed(1), requests_per_user=1),
            TypeError,
            "think_time_us",
        ),
    ],
)
def test_parameters_are_validated_at_construction(
    make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.0, TypeError), (True, TypeError)])
def test_seeds_must_be_non_negative_ints(seed: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="seed"):
        check_seed(seed)
    with pytest.raises(error, match="seed"):
        OpenLoopWorkload(PoissonArrivals(1), Fixed(1), Fixed(1), 3).generate(seed)  # type: ignore[arg-type]


def test_numpy_scalars_are_normalised_to_python_types() -> None:
    workload = OpenLoopWorkload(
        FixedRateArrivals(np.float64(10)), Fixed(np.int64(3)), Uniform(1, 2), np.int64(4)
    )
    assert type(workload.count) is int and type(workload.prompt_tokens.value) is int  # type: ignore[attr-defined]
    assert type(workload.arrivals.rate_per_s) is float  # type: ignore[attr-defined]
    request = workload.generate(np.int64(3)).requests[0]
    assert type(request.arrival_time_us) is int and type(request.prompt_token_count) is int


# ---------------------------------------------------------------------- determinism


WORKLOAD = OpenLoopWorkload(
    arrivals=PoissonArrivals(50),
    prompt_tokens=Uniform(10, 100),
    output_tokens=LogNormal(200, 1.0, low=1),
    count=5,
)


def test_same_seed_same_requests_different_seed_different_requests() -> None:
    first, again, other = WORKLOAD.generate(42), WORKLOAD.generate(42), WORKLOAD.generate(43)
    assert fields(first.requests) == fields(again.requests)
    assert fields(first.requests) != fields(other.requests)
    assert first.requests[0] is not again.requests[0]  # fresh objects every time
    big = OpenLoopWorkload(GammaArrivals(5, 2), LogNormal(900, 1.2), Exponential(80), 2_000)
    arrays = [np.array(fields(big.generate(seed).requests), dtype=np.int64) for seed in (9, 9, 10)]
    assert np.array_equal(arrays[0], arrays[1])
    assert not np.array_equal(arrays[0], arrays[2])


def test_seed_42_gives_the_committed_requests() -> None:
    # Pinned values: the same seed must give these requests on every machine (for a
    # given NumPy). If a NumPy upgrade ever changes them, that is a visible break.
    assert fields(WORKLOAD.generate(42).requests) == [
        (0, 19_376, 16, 36),
        (1, 55_941, 52, 456),
        (2, 65_091, 26, 258),
        (3, 70_636, 14, 71),
        (4, 135_949, 69, 212),
    ]


def test_each_quantity_has_its_own_stream() -> None:
    base = OpenLoopWorkload(GammaArrivals(20, 2), Uniform(1, 500), Uniform(1, 50), 1_000)
    impatient = OpenLoopWorkload(
        GammaArrivals(20, 2), Uniform(1, 500), Uniform(1, 50), 1_000, patience=Exponential(5e4)
    )
    other_prompts = OpenLoopWorkload(GammaArrivals(20, 2), LogNormal(300, 2), Uniform(1, 50), 1_000)
    plain, with_patience, reprompted = (
        w.generate(5).requests for w in (base, impatient, other_prompts)
    )
    assert fields(plain) == fields(with_patience)
    assert [r.arrival_time_us for r in plain] == [r.arrival_time_us for r in reprompted]
    assert [r.max_output_tokens for r in plain] == [r.max_output_tokens for r in reprompted]
    assert [r.prompt_token_count for r in plain] != [r.prompt_token_count for r in reprompted]


def test_ids_start_and_deadlines_are_arrival_plus_patience() -> None:
    workload = OpenLoopWorkload(
        PoissonArrivals(10),
        Fixed(8),
        Fixed(2),
        50,
        patience=Uniform(0, 1_000_000),
        first_request_id=100,
        start_us=5_000,
    )
    generated = workload.generate(1)
    assert [r.request_id for r in generated.requests] == list(range(100, 150))
    assert all(r.arrival_time_us > 5_000 for r in generated.requests)
    assert list(generated.cancellations) == sorted(generated.cancellations)
    patience = Uniform(0, 1_000_000).sample(
        np.random.default_rng(np.random.SeedSequence(1).spawn(4)[3]), 50
    )
    expected = sorted(
        PatienceDeadline(r.arrival_time_us + int(p), r.request_id)
        for r, p in zip(generated.requests, patience, strict=True)
    )
    assert list(generated.cancellations) == expected
    assert generated.cancellations[0] == (expected[0].time_us, expected[0].request_id)


# ---------------------------------------------------------------------- engine runs


def test_open_loop_runs_and_patience_cancels_at_the_deadline(
    engine: simsim.SimulationEngine,
) -> None:
    # A request every 250 us, each needing 100 + 2 * 50 + 10 * 10 = 300 us of service:
    # the queue grows, and clients give up 400 us after they arrive.
    workload = OpenLoopWorkload(
        FixedRateArrivals(4_000), Fixed(50), Fixed(10), count=20, patience=Fixed(400)
    )
    generated = workload.submit_to(engine, seed=0)
    engine.run()
    requests = engine.requests
    assert [requests[rid].state.name for rid in (0, 1)] == ["FINISHED", "FINISHED"]
    assert (requests[0].finish_time_us, requests[1].finish_time_us) == (550, 850)
    # Request 2 (arrival 750) would finish at 1150, exactly its deadline: the deadline
    # was scheduled first, so the client cancels before the last token counts.
    assert requests[2].state is simsim.RequestState.CANCELLED
    assert (requests[2].finish_time_us, requests[2].generated_token_count) == (1_150, 9)
    # Request 3 (arrival 1000) started at 1150, had 4 tokens when its client left at 1400.
    assert (requests[3].finish_time_us, requests[3].generated_token_count) == (1_400, 4)
    deadline_of = {d.request_id: d.time_us for d in generated.cancellations}
    for rid, request in requests.items():
        assert deadline_of[rid] == request.arrival_time_us + 400
        assert request.finish_time_us is not None
        if request.state is simsim.RequestState.CANCELLED:
            assert request.finish_time_us == deadline_of[rid]
        else:
            assert request.state is simsim.RequestState.FINISHED
            assert request.finish_time_us < deadline_of[rid]


def test_random_patience_cancels_queued_and_running_requests(
    engine: simsim.SimulationEngine,
) -> None:
    workload = OpenLoopWorkload(
        PoissonArrivals(4_000), Uniform(10, 100), Uniform(1, 20), 400, patience=Exponential(600)
    )
    generated = workload.submit_to(engine, seed=8)
    engine.run()
    deadline_of = {d.request_id: d.time_us for d in generated.cancellations}
    ends: dict[str, int] = defaultdict(int)
    for rid, request in engine.requests.items():
        assert request.finish_time_us is not None
        if request.state is simsim.RequestState.CANCELLED:
            assert request.finish_time_us == deadline_of[rid]
            ends["queued" if request.admit_time_us is None else "running"] += 1
        else:
            assert request.finish_time_us < deadline_of[rid]
            ends["finished"] += 1
    assert min(ends["queued"], ends["running"], ends["finished"]) >= 20, ends


def test_a_request_finishing_exactly_at_its_deadline_is_cancelled(
    engine: simsim.SimulationEngine,
) -> None:
    # Service takes exactly 300 us; a deadline at arrival + 300 wins the tie.
    workload = OpenLoopWorkload(FixedRateArrivals(1), Fixed(50), Fixed(10), 1, patience=Fixed(300))
    workload.submit_to(engine, seed=0)
    engine.run()
    request = engine.requests[0]
    assert request.state is simsim.RequestState.CANCELLED
    assert request.finish_time_us == 1_000_300 and request.generated_token_count == 9


def test_generated_workload_is_checked_before_anything_is_submitted(
    backend: simsim.SimulatedBackend,
) -> None:
    generated = WORKLOAD.generate(3)
    first = simsim.SimulationEngine(backend)
    generated.submit_to(first)
    with pytest.raises(ValueError, match="already submitted to this engine"):
        generated.submit_to(first)
    third = simsim.SimulationEngine(backend)
    third.submit(simsim.Request(4, 0, 1, 1))
    with pytest.raises(ValueError, match="request 4 was already submitted"):
        WORKLOAD.submit_to(third, seed=3)
    assert list(third.requests) == [4]


def run_closed_loop(
    workload: ClosedLoopWorkload, seed: int, backend: simsim.SimulatedBackend
) -> tuple[simsim.SimulationEngine, Any]:
    env = simsim.Environment()
    engine = simsim.SimulationEngine(backend, env=env)
    run = workload.start(env, engine, seed)
    engine.run()
    return engine, run


def check_users_alternate(engine: simsim.SimulationEngine, run: Any) -> dict[int, list[Any]]:
    """Each user's requests never overlap, and each starts exactly one think time later."""
    by_user: dict[int, list[Any]] = defaultdict(list)
    for submission in run.submissions:
        by_user[submission.user].append(submission)
    for submissions in by_user.values():
        assert [s.index for s in submissions] == list(range(len(submissions)))
        for before, after in itertools.pairwise(submissions):
            done = engine.requests[before.request_id]
            following = engine.requests[after.request_id]
            assert done.finish_time_us is not None
            assert following.arrival_time_us == after.submit_time_us
            assert following.arrival_time_us == done.finish_time_us + before.think_time_us
            assert following.arrival_time_us >= done.finish_time_us  # one outstanding
    return by_user


def test_closed_loop_users_wait_think_and_ask_again(backend: simsim.SimulatedBackend) -> None:
    workload = ClosedLoopWorkload(
        users=3,
        think_time_us=Uniform(0, 500),
        prompt_tokens=Uniform(10, 100),
        output_tokens=Uniform(1, 5),
        requests_per_user=6,
        first_request_id=10,
    )
    engine, run = run_closed_loop(workload, 11, backend)
    assert sorted(engine.requests) == list(range(10, 28))
    assert [s.request_id for s in run.submissions] == list(range(10, 28))
    assert run.submissions[:3] == tuple(run.submissions[:3])
    assert [(s.user, s.submit_time_us) for s in run.submissions[:3]] == [(0, 0), (1, 0), (2, 0)]
    by_user = check_users_alternate(engine, run)
    assert sorted(by_user) == [0, 1, 2] and all(len(s) == 6 for s in by_user.values())
    assert all(r.state is simsim.RequestState.FINISHED for r in engine.requests.values())
    # At any instant, a user has at most one request that has arrived and not ended.
    for user_submissions in by_user.values():
        spans = [
            (
                engine.requests[s.request_id].arrival_time_us,
                engine.requests[s.request_id].finish_time_us,
            )
            for s in user_submissions
        ]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # The sizes a user asks for come from its own stream, whatever the server does.
    user_seed = np.random.SeedSequence(11).spawn(3)[1]
    prompt_rng = np.random.default_rng(user_seed.spawn(4)[0])
    expected = [int(Uniform(10, 100).sample(prompt_rng, 1)[0]) for _ in range(6)]
    assert [engine.requests[s.request_id].prompt_token_count for s in by_user[1]] == expected


def test_closed_loop_is_deterministic(backend: simsim.SimulatedBackend) -> None:
    workload = ClosedLoopWorkload(
        4, Exponential(300), LogNormal(60, 1), Uniform(1, 8), requests_per_user=5
    )
    (engine_a, run_a), (engine_b, run_b) = (run_closed_loop(workload, 3, backend) for _ in range(2))
    assert run_a.submissions == run_b.submissions
    assert engine_a.requests_frame().equals(engine_b.requests_frame())
    _, run_c = run_closed_loop(workload, 4, backend)
    assert run_c.submissions != run_a.submissions


def test_closed_loop_stops_submitting_at_the_horizon(backend: simsim.SimulatedBackend) -> None:
    workload = ClosedLoopWorkload(
        users=2,
        think_time_us=Uniform(100, 300),
        prompt_tokens=Fixed(20),
        output_tokens=Fixed(3),
        horizon_us=5_000,
    )
    engine, run = run_closed_loop(workload, 0, backend)
    by_user = check_users_alternate(engine, run)
    assert all(s.submit_time_us < 5_000 for s in run.submissions)
    for submissions in by_user.values():
        last = submissions[-1]
        finish = engine.requests[last.request_id].finish_time_us
        assert finish is not None and finish + last.think_time_us >= 5_000
    assert len(run.submissions) >= 10
    assert all(p.triggered for p in run.processes)


def test_closed_loop_patience_cancels_and_the_user_moves_on(
    backend: simsim.SimulatedBackend,
) -> None:
    workload = ClosedLoopWorkload(
        users=4,
        think_time_us=Fixed(50),
        prompt_tokens=Fixed(50),
        output_tokens=Fixed(10),
        requests_per_user=3,
        patience=Uniform(200, 900),
    )
    engine, run = run_closed_loop(workload, 2, backend)
    check_users_alternate(engine, run)
    cancelled = 0
    for submission in run.submissions:
        request = engine.requests[submission.request_id]
        assert submission.patience_us is not None
        deadline = submission.submit_time_us + submission.patience_us
        if request.state is simsim.RequestState.CANCELLED:
            cancelled += 1
            assert request.finish_time_us == deadline
        else:
            assert request.finish_time_us is not None and request.finish_time_us < deadline
    assert 0 < cancelled < len(run.submissions)


def test_closed_loop_start_needs_the_engines_env(engine: simsim.SimulationEngine) -> None:
    workload = ClosedLoopWorkload(1, Fixed(0), Fixed(1), Fixed(1), requests_per_user=1)
    with pytest.raises(ValueError, match="engine's own environment"):
        workload.start(simsim.Environment(), engine, 0)


def test_a_horizon_the_users_start_at_or_after_is_refused(
    backend: simsim.SimulatedBackend,
) -> None:
    engine = simsim.SimulationEngine(backend)
    engine.env.run(until=5_000)
    workload = ClosedLoopWorkload(2, Fixed(0), Fixed(1), Fixed(1), horizon_us=5_000)
    with pytest.raises(ValueError, match=r"horizon_us 5000 is not after the time the users start"):
        workload.start(engine.env, engine, seed=0)
    assert not engine.requests


def test_one_generated_workload_feeds_any_number_of_engines(
    backend: simsim.SimulatedBackend,
) -> None:
    # The workload yields specs; each engine makes its own requests of them at submit.
    generated = OpenLoopWorkload(
        PoissonArrivals(4_000), Uniform(10, 100), Uniform(1, 20), 50, patience=Exponential(600)
    ).generate(8)
    assert all(type(spec) is simsim.RequestSpec for spec in generated.requests)
    engines = [simsim.SimulationEngine(backend) for _ in range(2)]
    for engine in engines:
        generated.submit_to(engine)
        engine.run()
    first, second = (engine.requests_frame() for engine in engines)
    assert first.equals(second)
    assert engines[0].requests[0] is not engines[1].requests[0]


def test_submit_with_deadlines_submits_first_then_cancels_in_the_order_given(
    backend: simsim.SimulatedBackend,
) -> None:
    # Scenarios and generated workloads both submit through this one function.
    engine = simsim.SimulationEngine(backend)
    submitted: list[int] = []

    def submit(request: simsim.RequestSpec | simsim.Request) -> None:
        submitted.append(request.request_id)
        engine.submit(request)

    specs = [simsim.RequestSpec(rid, 0, 50, 10) for rid in range(3)]
    # Request 0 would finish at 300 us: a deadline at 300 wins the tie; request 1 is
    # cancelled while queued; request 2 finished long before its deadline.
    submit_with_deadlines(engine, specs, [(300, 0), (100, 1), (10_000, 2)], submit=submit)
    assert submitted == [0, 1, 2]
    engine.run()
    states = {rid: request.state.name for rid, request in engine.requests.items()}
    assert states == {0: "CANCELLED", 1: "CANCELLED", 2: "FINISHED"}
    assert (engine.requests[0].finish_time_us, engine.requests[1].finish_time_us) == (300, 100)


def test_the_scenario_runner_has_no_submission_loop_of_its_own() -> None:
    import simsim.scenario.run as run
    import simsim.workloads.submission as submission

    assert not hasattr(run, "_canceller")
    assert run.submit_with_deadlines is submission.submit_with_deadlines
