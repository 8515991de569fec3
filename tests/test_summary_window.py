"""``summarize``'s measurement window (``warmup_us``, ``until_us``) and occupancy rows.

Hand-worked numbers come from the ``worked`` engine of ``test_results.py`` (its timeline
is repeated below) and from small frames built here; a brute-force step-function count
and queueing laws on a long run check the same numbers independently.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import simsim
from simsim import RequestState as S
from simsim.results import requests_frame

OCCUPANCY = ["mean_queue_length", "mean_active_requests", "utilization"]

# The worked engine of test_results.py (prefill = 100 + 2 * prompt, decode step = 10):
#   request: arrival, admit, finish        queued interval      holding interval
#   0:       0,     0,   230 (finished)    [0, 0)               [0, 230)
#   1:       10,  230,   340 (finished)    [10, 230)            [230, 340)
#   2:       20,  340,   490 (finished)    [20, 340)            [340, 490)
#   3:       30,    -,   200 (cancelled)   [30, 200)            -
#   4:       40,  490,   610 (cancelled)   [40, 490)            [490, 610)
#   5:   10_000,    -,    20 (cancelled before it arrived: never queued)
WORKED = [
    # id, state, arrival, prompt, max_out, tokens, admit, prefill_end, first, finish
    (0, S.FINISHED, 0, 50, 3, 3, 0, 200, 210, 230),
    (1, S.FINISHED, 10, 0, 1, 1, 230, 330, 340, 340),
    (2, S.FINISHED, 20, 25, 0, 0, 340, 490, None, 490),
    (3, S.CANCELLED, 30, 10, 5, 0, None, None, None, 200),
    (4, S.CANCELLED, 40, 0, 5, 2, 490, 590, 600, 610),
    (5, S.CANCELLED, 10_000, 7, 4, 0, None, None, None, 20),
]


def _frame(rows: list[tuple[object, ...]]) -> pd.DataFrame:
    requests = []
    for rid, state, arrival, prompt, out, tokens, admit, prefill, first, finish in rows:
        requests.append(
            simsim.Request(
                rid,
                arrival,
                prompt,
                out,
                state=state,
                generated_token_count=tokens,
                admit_time_us=admit,
                prefill_end_time_us=prefill,
                first_token_time_us=first,
                finish_time_us=finish,
            )
        )
    return requests_frame(requests)


@pytest.fixture
def worked_frame(backend: simsim.SimulatedBackend) -> pd.DataFrame:
    """The worked engine's table, checked against a real run of it."""
    frame = _frame(WORKED)
    engine = simsim.SimulationEngine(backend)
    for rid, _, arrival, prompt, out, *_ in WORKED:
        engine.submit(simsim.Request(rid, arrival, prompt, out))
    for at_us, rid in ((20, 5), (200, 3), (610, 4)):
        while engine.now_us < at_us:
            engine.run_next_timestamp()
        engine.cancel_request(rid)
    engine.run()
    pd.testing.assert_frame_equal(engine.requests_frame(), frame)
    return frame


def _values(frame: pd.DataFrame, **options: object) -> pd.Series:
    return simsim.summarize(frame, **options)["value"]  # type: ignore[arg-type]


def test_without_new_arguments_the_rows_and_numbers_do_not_change(
    worked_frame: pd.DataFrame,
) -> None:
    plain = simsim.summarize(worked_frame)
    assert not set(OCCUPANCY) & set(plain.index)
    with_slots = simsim.summarize(worked_frame, slots=1)
    # Only rows added, at the end; every existing number is the same.
    assert list(with_slots.index) == [*plain.index, *OCCUPANCY]
    pd.testing.assert_frame_equal(with_slots.loc[plain.index], plain)
    with_slo = simsim.summarize(worked_frame, ttft_slo_us=330, slots=1)
    assert list(with_slo.index) == [
        *plain.index,
        "slo_attainment",
        "goodput_requests_per_s",
        *OCCUPANCY,
    ]


def test_occupancy_of_the_worked_engine(worked_frame: pd.DataFrame) -> None:
    v = _values(worked_frame, slots=1)
    assert v["makespan_us"] == 610
    # The slot is held without a gap from 0 to 610.
    assert v["mean_active_requests"] == pytest.approx(1.0)
    assert v["utilization"] == pytest.approx(1.0)
    # Queued: 220 + 320 + 170 + 450 (request 5 never arrived, request 0 never waited).
    assert v["mean_queue_length"] == pytest.approx(1160 / 610)


def test_window_inside_the_run(worked_frame: pd.DataFrame) -> None:
    v = _values(worked_frame, slots=1, warmup_us=10, until_us=35)
    # Requests arriving in [10, 35): 1, 2 (finished) and 3 (cancelled).
    assert v["requests"] == 3
    assert v["count_FINISHED"] == 2 and v["count_CANCELLED"] == 1
    assert v["makespan_us"] == 25  # the window's length
    assert v["throughput_requests_per_s"] == pytest.approx(2 / 25e-6)
    assert v["throughput_tokens_per_s"] == pytest.approx(1 / 25e-6)  # 1 + 0 + 0 tokens
    # Latencies of those three, counted whole although they end after 35.
    assert v["queue_delay_us_mean"] == pytest.approx(270.0)  # 220 and 320
    assert v["e2e_latency_us_mean"] == pytest.approx(400.0)  # 330 and 470
    assert v["ttft_us_mean"] == pytest.approx(330.0)  # only request 1 had a token
    # Time averages over [10, 35): request 0 holds the slot throughout; queued:
    # request 1 for 25 us, request 2 for 15 us, request 3 for 5 us, request 4 not yet.
    assert v["mean_active_requests"] == pytest.approx(1.0)
    assert v["mean_queue_length"] == pytest.approx(45 / 25)


def test_warmup_only_runs_to_the_last_finish(worked_frame: pd.DataFrame) -> None:
    v = _values(worked_frame, slots=1, warmup_us=200)
    # Only request 5 arrives at 200 or later (at 10_000, cancelled at 20).
    assert v["requests"] == 1 and v["count_CANCELLED"] == 1
    assert v["makespan_us"] == 410  # [200, 610]
    assert math.isnan(v["e2e_latency_us_mean"])
    # Queued inside [200, 610): request 1 30 us, 2 140 us, 3 0 us (left at 200), 4 290 us.
    assert v["mean_queue_length"] == pytest.approx(460 / 410)
    assert v["utilization"] == pytest.approx(1.0)


def test_until_only_starts_at_the_first_arrival(worked_frame: pd.DataFrame) -> None:
    v = _values(worked_frame, slots=1, until_us=100)
    assert v["requests"] == 5  # all but request 5 (arrival 10_000)
    assert v["count_FINISHED"] == 3
    assert v["makespan_us"] == 100
    assert v["throughput_requests_per_s"] == pytest.approx(3 / 100e-6)
    # Queued inside [0, 100): 90 + 80 + 70 + 60.
    assert v["mean_queue_length"] == pytest.approx(3.0)
    assert v["mean_active_requests"] == pytest.approx(1.0)


def test_occupancy_with_several_slots() -> None:
    """Hand-made frame; intervals in the comments, makespan 0..10_000."""
    rows = [
        # id, state, arrival, prompt, out, tokens, admit, prefill_end, first, finish
        (0, S.FINISHED, 0, 8, 2, 2, 0, 100, 150, 190),  # holds 190
        (1, S.FINISHED, 1000, 8, 2, 2, 1100, 1200, 1300, 1400),  # waits 100, holds 300
        (2, S.FINISHED, 1050, 8, 2, 2, 1150, 1250, 1350, 1550),  # waits 100, holds 400
        (3, S.FINISHED, 5000, 8, 0, 0, 5000, 5050, None, 5050),  # holds 50
        (4, S.CANCELLED, 6000, 8, 4, 0, None, None, None, 10_000),  # waits 4000
    ]
    v = _values(_frame(rows), slots=2)
    assert v["makespan_us"] == 10_000
    assert v["mean_active_requests"] == pytest.approx(940 / 10_000)
    assert v["utilization"] == pytest.approx(940 / 10_000 / 2)
    assert v["mean_queue_length"] == pytest.approx(4200 / 10_000)


def test_open_intervals_are_cut_at_the_window_end(backend: simsim.SimulatedBackend) -> None:
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 0, 0, 5))  # prefill 100, tokens at 110..150
    engine.submit(simsim.Request(1, 50, 0, 1))
    while engine.now_us < 120:
        engine.run_next_timestamp()
    frame = engine.requests_frame()  # request 0 decoding, request 1 queued
    v = _values(frame, slots=1, until_us=120)
    assert v["mean_active_requests"] == pytest.approx(1.0)  # [0, 120)
    assert v["mean_queue_length"] == pytest.approx(70 / 120)  # [50, 120)
    # Without an end nothing has finished yet: no window, no time averages.
    v = _values(frame, slots=1)
    for name in ("makespan_us", *OCCUPANCY):
        assert math.isnan(v[name]), name


def test_empty_frame_gives_nan_occupancy(backend: simsim.SimulatedBackend) -> None:
    v = _values(simsim.SimulationEngine(backend).requests_frame(), slots=1)
    assert v["requests"] == 0
    for name in OCCUPANCY:
        assert math.isnan(v[name]), name
    v = _values(simsim.SimulationEngine(backend).requests_frame(), slots=1, until_us=10)
    assert v["requests"] == 0
    assert math.isnan(v["makespan_us"])  # no first arrival: the window has no start


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"slots": 0}, ValueError, "slots must be >= 1, got 0"),
        ({"slots": True}, TypeError, "slots must be an int, got bool"),
        ({"slots": 2.0}, TypeError, "slots must be an int, got float"),
        ({"warmup_us": -1}, ValueError, "warmup_us must be >= 0"),
        ({"warmup_us": 1.5}, TypeError, "warmup_us must be an int number of microseconds"),
        ({"until_us": False}, TypeError, "until_us must be an int number of microseconds"),
        ({"warmup_us": 10, "until_us": 10}, ValueError, r"until_us \(10\) must be greater"),
        ({"until_us": 2**63}, OverflowError, "until_us"),
        ({"warmup_us": 610}, ValueError, r"warmup_us \(610\) is at or after the last finish"),
        ({"warmup_us": 10**9}, ValueError, "the measurement window is empty"),
        ({"ttft_slo_us": -1}, ValueError, "ttft_slo_us must be a finite number >= 0"),
        ({"ttft_slo_us": True}, TypeError, "ttft_slo_us must be a number of microseconds"),
        ({"ttft_slo_us": float("inf")}, ValueError, "ttft_slo_us must be a finite number"),
        ({"tpot_slo_us": -0.5}, ValueError, "tpot_slo_us must be a finite number >= 0"),
        ({"tpot_slo_us": float("nan")}, ValueError, "tpot_slo_us must be a finite number"),
        ({"tpot_slo_us": True}, TypeError, "tpot_slo_us must be a number of microseconds"),
        ({"tpot_slo_us": "5"}, TypeError, "tpot_slo_us must be a number of microseconds"),
    ],
)
def test_bad_window_or_slots_are_refused(
    worked_frame: pd.DataFrame, options: dict[str, object], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        simsim.summarize(worked_frame, **options)  # type: ignore[arg-type]


def test_numpy_integers_are_accepted(worked_frame: pd.DataFrame) -> None:
    numpy_args = _values(
        worked_frame, slots=np.int64(1), warmup_us=np.int64(10), until_us=np.int32(35)
    )
    pd.testing.assert_series_equal(
        numpy_args, _values(worked_frame, slots=1, warmup_us=10, until_us=35)
    )


# ------------------------------------------------------- independent computations


def _brute_force(frame: pd.DataFrame, start: int, end: int) -> tuple[float, float]:
    """Count queued and slot-holding requests at every microsecond of ``[start, end)``."""
    queued = active = 0
    for t in range(start, end):
        for row in frame.itertuples():
            arrived = row.arrival_time_us <= t
            admitted = not pd.isna(row.admit_time_us) and row.admit_time_us <= t
            ended = not pd.isna(row.finish_time_us) and row.finish_time_us <= t
            queued += arrived and not admitted and not ended
            active += admitted and not ended
    return queued / (end - start), active / (end - start)


def _random_frame(rng: np.random.Generator, count: int) -> pd.DataFrame:
    """Terminal, running and queued requests with consistent times in 0..~300 us."""
    requests = []
    for rid in range(count):
        arrival = int(rng.integers(0, 200))
        kind = rng.integers(0, 5)
        if kind == 0:  # cancelled before it arrived
            cancel = int(rng.integers(0, 1 + arrival))
            req = simsim.Request(rid, arrival, 1, 1, state=S.CANCELLED, finish_time_us=cancel)
        elif kind == 1:  # cancelled while queued, or still queued
            finish = arrival + int(rng.integers(0, 60)) if rng.random() < 0.5 else None
            state = S.CANCELLED if finish is not None else S.WAITING
            req = simsim.Request(rid, arrival, 1, 1, state=state, finish_time_us=finish)
        else:  # admitted: finished, cancelled while running, or still running
            admit = arrival + int(rng.integers(0, 50))
            finish = admit + int(rng.integers(0, 50)) if kind < 4 else None
            state = S.FINISHED if kind == 2 else (S.CANCELLED if kind == 3 else S.PREFILLING)
            req = simsim.Request(
                rid, arrival, 1, 0, state=state, admit_time_us=admit, finish_time_us=finish
            )
        requests.append(req)
    return requests_frame(requests)


@pytest.mark.parametrize("seed", range(12))
def test_time_averages_equal_a_brute_force_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    frame = _random_frame(rng, int(rng.integers(1, 12)))
    warmup = int(rng.integers(0, 150))
    until = warmup + int(rng.integers(1, 150))
    v = _values(frame, slots=3, warmup_us=warmup, until_us=until)
    queue, active = _brute_force(frame, warmup, until)
    assert v["makespan_us"] == until - warmup
    assert v["mean_queue_length"] == pytest.approx(queue)
    assert v["mean_active_requests"] == pytest.approx(active)
    assert v["utilization"] == pytest.approx(active / 3)
    arrivals = frame["arrival_time_us"]
    assert v["requests"] == ((arrivals >= warmup) & (arrivals < until)).sum()


@pytest.fixture(scope="module")
def long_mm1_run() -> tuple[pd.DataFrame, float, int, int]:
    """About 20,000 Poisson arrivals at load 0.5 on the single slot, near-exponential service.

    Service = prefill 1 + 1 us per prompt token, no output: prompt lengths are
    geometric with mean 999, so E[S] = 1000 us exactly.
    """
    rng = np.random.default_rng(20250612)
    count = 20_000
    mean_service_us = 1000.0
    rate_per_us = 0.5 / mean_service_us
    arrivals = np.round(np.cumsum(rng.exponential(1 / rate_per_us, count))).astype(np.int64)
    prompts = rng.geometric(1 / 1000, count) - 1  # support 0, 1, ...; mean 999
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=1,
            prefill_per_token_us=1,
            prefill_per_active_sequence_us=0,
            decode_base_us=0,
            decode_per_active_sequence_us=0,
        )
    )
    engine = simsim.FastSimulationEngine(backend)
    for rid, (arrival, prompt) in enumerate(zip(arrivals, prompts, strict=True)):
        engine.submit(simsim.Request(rid, int(arrival), int(prompt), 0))
    engine.run()
    warmup = int(arrivals[count // 10])
    until = int(arrivals[-1])
    return engine.requests_frame(), rate_per_us * mean_service_us, warmup, until


def test_littles_law_on_a_long_run(long_mm1_run: tuple[pd.DataFrame, float, int, int]) -> None:
    frame, _, warmup, until = long_mm1_run
    v = _values(frame, slots=1, warmup_us=warmup, until_us=until)
    arrival_rate_per_us = v["requests"] / v["makespan_us"]
    in_system = v["mean_queue_length"] + v["mean_active_requests"]
    # L = lambda W and Lq = lambda Wq, up to edge effects at the window's ends.
    assert in_system == pytest.approx(arrival_rate_per_us * v["e2e_latency_us_mean"], rel=0.01)
    assert v["mean_queue_length"] == pytest.approx(
        arrival_rate_per_us * v["queue_delay_us_mean"], rel=0.01
    )


def test_utilization_matches_rho_and_mm1_queue_length(
    long_mm1_run: tuple[pd.DataFrame, float, int, int],
) -> None:
    frame, rho, warmup, until = long_mm1_run
    v = _values(frame, slots=1, warmup_us=warmup, until_us=until)
    assert v["utilization"] == pytest.approx(rho, rel=0.03)
    # M/M/1: Lq = rho^2 / (1 - rho) = 0.5 (the service is nearly exponential:
    # geometric with a 1 us offset, so a looser tolerance).
    assert v["mean_queue_length"] == pytest.approx(rho**2 / (1 - rho), rel=0.1)


def test_makespan_is_exact_far_from_zero() -> None:
    """Times past 2**53 do not fit a float exactly: the window's length is taken in ints."""
    base = 2**60
    rows = [(0, S.FINISHED, base + 1, 1, 0, 0, base + 1, base + 4, None, base + 4)]
    frame = _frame(rows)
    assert _values(frame)["makespan_us"] == 3
    v = _values(frame, slots=1, warmup_us=base + 1)
    assert v["makespan_us"] == 3
    assert v["requests"] == 1
    assert v["utilization"] == 1.0  # admitted on arrival, held for all 3 us
    assert v["mean_queue_length"] == 0.0
