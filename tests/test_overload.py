"""Issue 26, point 6: an overloaded run is named (``simsim.overload.overload_check``),
in the run's summary, by ``simsim run`` and in a sweep's table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simsim
from simsim.cli import main
from simsim.cli.report import sweep_report
from simsim.overload import MIN_GROWTH, overload_check
from simsim.results import OVERLOAD_METRICS

MEAN_SERVICE_US = 1_000


def mm1(rho: float, count: int, seed: int) -> pd.DataFrame:
    """An M/M/1-like run: Poisson arrivals at load *rho* on one slot whose service time
    is 1 us per prompt token, prompts geometric with mean 1,000 (so about exponential)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(MEAN_SERVICE_US / rho, count)).astype(np.int64)
    prompts = rng.geometric(1 / MEAN_SERVICE_US, count)
    engine = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(prefill_per_token_us=1))
    )
    for rid in range(count):
        engine.submit(simsim.Request(rid, int(arrivals[rid]), int(prompts[rid]), 0))
    engine.run()
    return engine.requests_frame()


@pytest.mark.parametrize("seed", range(8))
def test_a_stable_single_slot_at_70_percent_is_never_overloaded(seed: int) -> None:
    for count in (60, 400, 2_000):
        verdict = overload_check(mm1(0.7, count, seed))
        assert not verdict.overloaded, (count, verdict)


@pytest.mark.parametrize("seed", range(4))
def test_a_single_slot_at_120_percent_is_overloaded(seed: int) -> None:
    verdict = overload_check(mm1(1.2, 2_000, seed))
    assert verdict.overloaded, verdict
    assert verdict.arrival_rate_per_s > verdict.completion_rate_per_s
    assert verdict.queue_end > verdict.queue_start
    assert verdict.queue_growth >= verdict.growth_threshold
    assert "the queue grew by" in verdict.reason


def batching_run(rate_per_s: float, seed: int) -> pd.DataFrame:
    """A batching server of 8 slots: prefill 2 ms + 10 us per token, decode steps of
    5 ms + 0.5 ms per sequence; 64-token prompts and 20-token outputs. Full, it
    completes about 8 / (20 * 9 ms) = 44 requests/s."""
    config = simsim.SimulatedBackendConfig(2_000, 10, 0, 5_000, 500)
    engine = simsim.BatchingEngine(simsim.SimulatedBackend(config), max_active_requests=8)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1e6 / rate_per_s, 1_500)
    for rid, arrival in enumerate(np.cumsum(gaps).astype(np.int64)):
        engine.submit(simsim.Request(rid, int(arrival), 64, 20))
    engine.run()
    return engine.requests_frame()


def test_a_batching_server_is_judged_by_its_queue_not_its_filling_batch() -> None:
    for seed in range(3):
        assert not overload_check(batching_run(25.0, seed)).overloaded
        assert overload_check(batching_run(80.0, seed)).overloaded


def hand_made(service_us: int, count: int = 100) -> pd.DataFrame:
    """One arrival every 1,000 us; one server admits each request when the previous one
    leaves and holds it *service_us*."""
    rows = []
    free = 0
    for rid in range(count):
        arrival = 1_000 * rid
        admit = max(arrival, free)
        free = admit + service_us
        rows.append((rid, "FINISHED", arrival, admit, free))
    columns = ["request_id", "state", "arrival_time_us", "admit_time_us", "finish_time_us"]
    frame = pd.DataFrame(rows, columns=columns)
    for column in columns[2:]:
        frame[column] = frame[column].astype("Int64")
    return frame


def test_a_hand_made_frame() -> None:
    # Service 2,000 us: request i is admitted at 2,000 i and finishes at 2,000 (i + 1).
    # The window is [0, 99,001); its second half [49,500, 99,001) sees arrivals 50..99
    # (50) and finishes 2,000 * 25 .. 2,000 * 49 (25). The queue at t is about t / 2,000:
    # growth 49,500 / 2,000 = 24.75 > max(5% of 50, 15).
    verdict = overload_check(hand_made(2_000))
    assert verdict.overloaded
    assert (verdict.start_us, verdict.end_us) == (0, 99_001)
    assert (verdict.arrivals, verdict.completions) == (100, 49)
    assert verdict.arrival_rate_per_s == pytest.approx(100 / 0.099001)
    assert verdict.completion_rate_per_s == pytest.approx(49 / 0.099001)
    # at 0 one request arrived and was admitted; at 99,000: 100 arrived, 50 admitted
    assert (verdict.queue_start, verdict.queue_end) == (0, 50)
    assert verdict.queue_growth == pytest.approx(24.75, abs=0.5)
    assert verdict.growth_threshold == MIN_GROWTH
    # Service 500 us: nobody ever waits.
    stable = overload_check(hand_made(500))
    assert not stable.overloaded
    assert (stable.queue_start, stable.queue_end, stable.queue_growth) == (0, 0, 0.0)
    assert "less than 15.0" in stable.reason


def test_a_stage_window_and_too_few_arrivals() -> None:
    frame = hand_made(2_000)
    stage = overload_check(frame, start_us=0, end_us=20_000)
    assert (stage.overloaded, stage.arrivals) == (False, 20)
    assert stage.reason == "too few arrivals to judge (20 < 50)"
    late = overload_check(frame, start_us=30_000)
    assert late.overloaded and late.arrivals == 70
    empty = overload_check(simsim.results.requests_frame([]))
    assert (empty.overloaded, empty.reason, empty.start_us, empty.arrivals) == (
        False,
        "no request arrived",
        None,
        0,
    )
    assert np.isnan(empty.arrival_rate_per_s)


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"missing columns \['admit_time_us'"):
        overload_check(pd.DataFrame({"state": [], "arrival_time_us": []}))
    with pytest.raises(ValueError, match="end_us=10 must be after start_us=10"):
        overload_check(hand_made(500), start_us=10, end_us=10)
    with pytest.raises(TypeError, match="start_us"):
        overload_check(hand_made(500), start_us=1.5)  # type: ignore[arg-type]


def test_run_summary_appends_the_overload_rows() -> None:
    engine = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(prefill_per_token_us=1))
    )
    for rid in range(100):
        engine.submit(simsim.Request(rid, 1_000 * rid, 2_000, 0))
    engine.run()
    summary = simsim.results.run_summary(engine)["value"]
    assert list(summary.index[-len(OVERLOAD_METRICS) :]) == list(OVERLOAD_METRICS)
    verdict = overload_check(engine.requests_frame())
    assert verdict.overloaded
    assert summary["overloaded"] == 1.0
    assert summary["arrival_rate_requests_per_s"] == verdict.arrival_rate_per_s
    assert summary["completion_rate_requests_per_s"] == verdict.completion_rate_per_s
    assert summary["queue_growth"] == verdict.queue_growth


SCENARIO = """
[scenario]
name = "overload"
seed = 5
[backend]
prefill_base_us = 2_000
prefill_per_token_us = 50
decode_base_us = 8_000
[workload]
count = 300
rate_per_s = {rate}
prompt_tokens = [100, 100]
output_tokens = [10, 10]
"""
# Each request takes 2,000 + 5,000 + 10 x 8,000 = 87,000 us: about 11.5 requests/s.


def test_simsim_run_says_when_a_run_is_overloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "overload.toml"
    path.write_text(SCENARIO.format(rate=20.0), encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "overloaded" in line]
    assert len(lines) == 1
    assert lines[0].startswith("overloaded: the queue grew from 0 to ")
    assert lines[0].endswith("/s - latencies are not steady-state")
    assert ", completions 11.4" in lines[0] or ", completions 11.5" in lines[0]
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("metric")["value"]
    assert summary["overloaded"] == 1.0
    path.write_text(SCENARIO.format(rate=4.0), encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "calm")]) == 0
    assert "overloaded" not in capsys.readouterr().out


def test_the_sweep_table_has_an_overloaded_column_when_a_point_is(tmp_path: Path) -> None:
    import tomllib

    document: dict[str, Any] = tomllib.loads(SCENARIO.format(rate=1.0))
    result = simsim.sweep(document, {"workload.rate_per_s": [4.0, 20.0]}, replications=2, workers=1)
    means = result.summary[result.summary["metric"] == "overloaded"]["mean"].tolist()
    assert means == [0.0, 1.0]
    report = sweep_report(result, None).splitlines()
    assert report[1].split()[-1] == "overloaded"
    assert report[-2].split()[-1] == "no" and report[-1].split()[-1] == "yes"
    calm = simsim.sweep(document, {"workload.rate_per_s": [2.0, 4.0]}, replications=1, workers=1)
    assert "overloaded" not in sweep_report(calm, None)
