"""inference-perf's constant timer: exponential gaps rescaled to fill each stage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simsim.cli import main
from simsim.workloads.arrivals import StagedArrivals


def test_exponential_gaps_fill_each_stage_exactly() -> None:
    arrivals = StagedArrivals([(5.0, 10_000_000), (10.0, 10_000_000)], gaps="exponential")
    times = arrivals.arrival_times_us(np.random.default_rng(3), arrivals.count)
    assert len(times) == 50 + 100
    assert times[49] == 10_000_000  # the first stage's last request at its end
    assert times[-1] == 20_000_000
    assert (np.diff(times) >= 0).all()
    assert (times[50:] > 10_000_000).all()  # the second stage after the first
    gaps = np.diff(times[:50])
    assert gaps.std() > 0.5 * gaps.mean()  # random, not even (exponential: std = mean)


def test_exponential_gaps_are_seeded() -> None:
    arrivals = StagedArrivals([(2.0, 30_000_000)], gaps="exponential")
    first = arrivals.arrival_times_us(np.random.default_rng(7), 60)
    again = arrivals.arrival_times_us(np.random.default_rng(7), 60)
    other = arrivals.arrival_times_us(np.random.default_rng(8), 60)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    # fewer requests than the stages make: the first ones of the same draw
    assert arrivals.arrival_times_us(np.random.default_rng(7), 10).tolist() == first[:10].tolist()


def test_even_gaps_stay_the_default() -> None:
    arrivals = StagedArrivals([(4.0, 1_000_000)])
    assert arrivals.gaps == "even"
    assert arrivals.arrival_times_us(np.random.default_rng(0), 4).tolist() == [
        250_000,
        500_000,
        750_000,
        1_000_000,
    ]


def test_unknown_gaps_are_refused() -> None:
    with pytest.raises(
        ValueError, match="gaps must be one of 'even', 'exponential', got 'poisson'"
    ):
        StagedArrivals([(4.0, 1_000_000)], gaps="poisson")


SCENARIO = """\
[scenario]
engine = "batching"
seed = 5
[backend]
prefill_base_us = 2000
decode_base_us = 8000
[batching]
max_active_requests = 8
[workload]
prompt_tokens = 10
output_tokens = 5
arrivals = {{ process = "staged", stages = [{{ rate_per_s = 4, duration_s = 5 }}]{gaps} }}
"""


def test_scenario_key_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(gaps=', gaps = "exponential"'))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    arrivals = pd.read_csv(tmp_path / "out/requests.csv")["arrival_time_us"]
    assert len(arrivals) == 20 and arrivals.max() == 5_000_000
    assert arrivals.diff().dropna().nunique() > 1  # not one request every 250 ms
    path.write_text(SCENARIO.format(gaps=', gaps = "random"'))
    assert main(["validate", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "gaps" in error and "'exponential'" in error
