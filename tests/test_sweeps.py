"""``simsim.sweep`` and ``simsim.capacity_search``, black-box against their docstrings.

The sweep's promise is that a run's result depends only on the scenario, the grid point,
the replication and the root seed: never on the executor, the number of workers or the
order runs complete in. So most tests here compare whole frames between ways of running
the same sweep, and every point's metrics against running that scenario by hand.

Workloads are kept small (about 100-150 requests a run) so the file runs in seconds.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

import simsim
from simsim.results import (
    OVERLOAD_METRICS,
    REQUEST_COLUMNS,
    percentile_label,
    requests_frame,
    summarize,
)
from simsim.scenario import ScenarioError, parse_scenario, run_scenario
from simsim.sweeps import (
    SweepFolderError,
    SweepStopped,
    aggregate,
    expand_grid,
    mean_interval,
    metric_range,
    run_seed,
    student_t_quantile,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scenarios"

#: A single-slot scenario: prefill = 2000 + 50 * prompt, decode step = 8000 (us);
#: the mean service time is about 0.14 s, so 2 requests/s keep the slot about 27% busy.
BASE: dict[str, Any] = {
    "scenario": {"name": "sweep-test", "seed": 1},
    "backend": {"prefill_base_us": 2_000, "prefill_per_token_us": 50, "decode_base_us": 8_000},
    "workload": {
        "count": 120,
        "rate_per_s": 2.0,
        "prompt_tokens": [16, 256],
        "output_tokens": [1, 32],
    },
}

#: Batching cases crossed with slots and load: the sweep every executor must agree on.
EXECUTOR_GRID: dict[str, list[Any]] = {
    "workload.rate_per_s": [2.0, 6.0],
    "batching.max_active_requests": [2, 6],
}
EXECUTOR_CASES: dict[str, dict[str, Any]] = {
    "prefill_first": {"scenario.engine": "batching"},
    "mixed": {
        "scenario.engine": "batching",
        "batching.policy": "mixed",
        "batching.max_batch_tokens": 256,
    },
}
EXECUTOR_RUNS = 2 * 2 * 2 * 2  # cases x rates x slots x replications


# ---------------------------------------------------------------- helpers and models


def metric_names(**summarize_options: Any) -> list[str]:
    """The metrics ``summarize`` reports with these options, in its order."""
    return list(summarize(requests_frame([]), **summarize_options).index)


def scenario_metrics(**summarize_options: Any) -> list[str]:
    """The metrics a scenario's run reports: ``summarize``'s with the server's slots,
    whose occupancy rows come after the others (issue 25, point 5), then the overload
    rows (issue 26, point 6)."""
    return [*metric_names(slots=1, **summarize_options), *OVERLOAD_METRICS]


def with_settings(document: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """*document* with every dotted key of *settings* set (written here, not the library's)."""
    result = copy.deepcopy(dict(document))
    for key, value in settings.items():
        *tables, last = key.split(".")
        table = result
        for name in tables:
            table = table.setdefault(name, {})
        table[last] = copy.deepcopy(value)
    return result


def direct_metrics(
    document: Mapping[str, Any],
    settings: Mapping[str, Any],
    seed: int,
    *,
    base_dir: Path | None = None,
    **summarize_options: Any,
) -> pd.Series:
    """The summary of running the scenario by hand, with the settings and the seed."""
    scenario = parse_scenario(
        with_settings(document, {**settings, "scenario.seed": seed}), base_dir=base_dir
    )
    return summarize(run_scenario(scenario).requests_frame(), **summarize_options)["value"]


def assert_rows_match_direct_runs(
    result: simsim.SweepResult,
    document: Mapping[str, Any],
    case_settings: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    base_dir: Path | None = None,
    **summarize_options: Any,
) -> None:
    metrics = metric_names(**summarize_options)
    # to_dict keeps each column's type: iterrows would turn 63-bit seeds into floats.
    for row in result.runs.to_dict("records"):
        settings = dict((case_settings or {}).get(row.get("case"), {}))
        settings.update({axis: row[axis] for axis in result.axes})
        expected = direct_metrics(
            document, settings, row["seed"], base_dir=base_dir, **summarize_options
        )
        assert list(expected.index) == metrics
        np.testing.assert_array_equal(
            [row[m] for m in metrics], expected.to_numpy(dtype=float), err_msg=str(row)
        )


def finished_requests(ttft_us: np.ndarray) -> pd.DataFrame:
    """A ``requests_frame``-shaped table of finished 4-token requests with these TTFTs."""
    count = len(ttft_us)
    arrival = np.arange(count, dtype=np.int64) * 1_000
    first_token = arrival + ttft_us
    finish = first_token + 30  # three more tokens, 10 us apart
    frame = pd.DataFrame(
        {
            "request_id": np.arange(count, dtype=np.int64),
            "state": ["FINISHED"] * count,
            "arrival_time_us": arrival,
            "prompt_token_count": np.full(count, 10, dtype=np.int64),
            "max_output_tokens": np.full(count, 4, dtype=np.int64),
            "generated_token_count": np.full(count, 4, dtype=np.int64),
            "admit_time_us": arrival,
            "prefill_end_time_us": first_token,
            "first_token_time_us": first_token,
            "finish_time_us": finish,
            "queue_delay_us": np.zeros(count, dtype=np.int64),
            "ttft_us": ttft_us,
            "e2e_latency_us": finish - arrival,
            "tpot_us": np.full(count, 10.0),
        }
    )
    return frame[list(REQUEST_COLUMNS)]


def synthetic_model(params: dict[str, Any], seed: int) -> pd.DataFrame:
    """A stand-in simulation: mean TTFT = 1000 * ``load`` us, plus a seeded per-run offset.

    ``spread`` (default 100 us) is the standard deviation of that offset, so it sets how
    wide the confidence interval over replications is.
    """
    rng = np.random.default_rng(seed)
    level = float(params.get("load", 1.0))
    spread = float(params.get("spread", 100.0))
    offset = rng.normal(0.0, spread)
    ttft = level * 1_000 + offset + rng.normal(0.0, 20.0, size=30)
    return finished_requests(np.rint(np.clip(ttft, 1, None)).astype(np.int64))


def sometimes_unmeasured_model(params: dict[str, Any], seed: int) -> pd.DataFrame:
    """:func:`synthetic_model`, but above ``load`` 5 or for odd seeds when ``odd_fail`` is
    set, every request is cancelled before its first token: no latency can be measured."""
    frame = synthetic_model(params, seed)
    if float(params.get("load", 1.0)) > 5.0 or (params.get("odd_fail") and seed % 2):
        for column in ("first_token_time_us", "finish_time_us", "prefill_end_time_us"):
            frame[column] = pd.array([pd.NA] * len(frame), dtype="Int64")
        for column in ("ttft_us", "e2e_latency_us"):
            frame[column] = pd.array([pd.NA] * len(frame), dtype="Int64")
        frame["tpot_us"] = pd.array([pd.NA] * len(frame), dtype="Float64")
        frame["generated_token_count"] = 0
        frame["state"] = "CANCELLED"
    return frame


#: Every call of :func:`counting_model` in this process, as (params, seed).
CALLS: list[tuple[dict[str, Any], int]] = []


def counting_model(params: dict[str, Any], seed: int) -> pd.DataFrame:
    """:func:`synthetic_model`, recording each call in :data:`CALLS` (serial runs only)."""
    CALLS.append((dict(params), seed))
    return synthetic_model(params, seed)


@pytest.fixture
def calls() -> Iterator[list[tuple[dict[str, Any], int]]]:
    CALLS.clear()
    yield CALLS
    CALLS.clear()


class ReorderingExecutor(concurrent.futures.Executor):
    """Holds submitted calls until *batch* are in, then runs and completes them in another
    order (reversed, or shuffled with a fixed seed) on a helper thread.

    ``completed`` lists the submission indices in the order their futures finished.
    """

    def __init__(self, batch: int, order: str) -> None:
        self.batch = batch
        self.order = order
        self.completed: list[int] = []
        self._held: list[tuple[concurrent.futures.Future[Any], Callable[..., Any], Any]] = []
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._held.append((future, fn, (args, kwargs)))
        if len(self._held) == self.batch:
            held, self._held = self._held, []
            order = list(range(len(held)))
            if self.order == "reverse":
                order.reverse()
            else:
                random.Random(20_240_601).shuffle(order)
            thread = threading.Thread(target=self._complete, args=(held, order), daemon=True)
            self._threads.append(thread)
            thread.start()
        return future

    def _complete(self, held: list[Any], order: list[int]) -> None:
        for index in order:
            future, fn, (args, kwargs) = held[index]
            if not future.set_running_or_notify_cancel():
                continue
            try:
                value = fn(*args, **kwargs)
            except BaseException as error:
                self.completed.append(index)
                future.set_exception(error)
            else:
                self.completed.append(index)
                future.set_result(value)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for thread in self._threads:
            thread.join()


def executor_sweep(**options: Any) -> simsim.SweepResult:
    return simsim.sweep(
        BASE, EXECUTOR_GRID, cases=EXECUTOR_CASES, replications=2, seed=11, **options
    )


@pytest.fixture(scope="module")
def reference() -> simsim.SweepResult:
    """The executor sweep run serially, in this process."""
    return executor_sweep(workers=1)


def assert_same_result(result: simsim.SweepResult, expected: simsim.SweepResult) -> None:
    pdt.assert_frame_equal(result.runs, expected.runs)
    pdt.assert_frame_equal(result.summary, expected.summary)
    assert (result.axes, result.cases, result.load, result.seed) == (
        expected.axes,
        expected.cases,
        expected.load,
        expected.seed,
    )


# ---------------------------------------------------------------- executors


def test_serial_reference_runs_every_point_and_replication(
    reference: simsim.SweepResult,
) -> None:
    runs = reference.runs
    assert len(runs) == EXECUTOR_RUNS
    assert reference.cases == ("prefill_first", "mixed")
    assert reference.axes == ("workload.rate_per_s", "batching.max_active_requests")
    assert (runs["requests"] == 120).all()
    assert (runs["count_FINISHED"] == 120).all()
    # Different points and replications really did run different simulations.
    assert runs["ttft_us_mean"].nunique() == EXECUTOR_RUNS


def test_batching_cases_match_running_each_scenario_directly(
    reference: simsim.SweepResult,
) -> None:
    assert_rows_match_direct_runs(reference, BASE, EXECUTOR_CASES)


@pytest.mark.parametrize(
    "make_executor",
    [
        pytest.param(lambda: concurrent.futures.ProcessPoolExecutor(max_workers=2), id="process"),
        pytest.param(lambda: concurrent.futures.ThreadPoolExecutor(max_workers=3), id="thread"),
        pytest.param(lambda: ReorderingExecutor(EXECUTOR_RUNS, "reverse"), id="reverse"),
        pytest.param(lambda: ReorderingExecutor(EXECUTOR_RUNS, "shuffle"), id="shuffle"),
    ],
)
def test_any_executor_gives_identical_frames(
    reference: simsim.SweepResult,
    make_executor: Callable[[], concurrent.futures.Executor],
) -> None:
    executor = make_executor()
    with executor:
        result = executor_sweep(executor=executor)
        if not isinstance(executor, ReorderingExecutor):
            # The caller owns the executor: the sweep leaves it usable.
            assert executor.submit(math.sqrt, 16.0).result() == 4.0
    assert_same_result(result, reference)
    if isinstance(executor, ReorderingExecutor):
        # Every run went through it, finishing in an order other than submission's.
        assert sorted(executor.completed) == list(range(EXECUTOR_RUNS))
        assert executor.completed != list(range(EXECUTOR_RUNS))


def test_a_pool_of_two_workers_gives_identical_frames(reference: simsim.SweepResult) -> None:
    assert_same_result(executor_sweep(workers=2), reference)


@pytest.fixture(scope="module")
def dask_executor() -> Iterator[concurrent.futures.Executor]:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client.get_executor()


def test_dask_local_cluster_gives_identical_frames(
    reference: simsim.SweepResult, dask_executor: concurrent.futures.Executor
) -> None:
    assert isinstance(dask_executor, concurrent.futures.Executor)
    assert_same_result(executor_sweep(executor=dask_executor), reference)


def test_dask_local_cluster_capacity_search_matches_serial(
    dask_executor: concurrent.futures.Executor,
) -> None:
    options: dict[str, Any] = {
        "low": 0.5,
        "high": 12.0,
        "tolerance": 1.0,
        "targets": {"ttft_us_p90": 1_000_000},
        "replications": 2,
    }
    serial = simsim.capacity_search(BASE, "workload.rate_per_s", workers=1, **options)
    dask = simsim.capacity_search(BASE, "workload.rate_per_s", executor=dask_executor, **options)
    assert (dask.value, dask.interval, dask.status) == (serial.value, serial.interval, "found")
    pdt.assert_frame_equal(dask.evaluations, serial.evaluations)
    pdt.assert_frame_equal(dask.runs, serial.runs)


def test_model_callable_runs_serially_and_in_a_process_pool() -> None:
    grid = {"load": [1.0, 2.5], "spread": [10.0, 300.0]}
    serial = simsim.sweep(synthetic_model, grid, replications=3, seed=5, workers=1)
    pooled = simsim.sweep(synthetic_model, grid, replications=3, seed=5, workers=2)
    assert_same_result(pooled, serial)
    runs = serial.runs
    assert list(runs.columns[:5]) == ["point", "load", "spread", "replication", "seed"]
    for row in runs.to_dict("records"):
        params = {"load": row["load"], "spread": row["spread"]}
        expected = summarize(synthetic_model(params, row["seed"]))["value"]
        np.testing.assert_array_equal([row[m] for m in expected.index], expected)
    # The model's TTFT tracks its load: about 1000 us per unit.
    means = serial.summary.query("metric == 'ttft_us_mean' and spread == 10.0")["mean"]
    np.testing.assert_allclose(means.to_numpy(), [1_000.0, 2_500.0], rtol=0.02)


# ---------------------------------------------------------------- seeds


def expected_seed(root: int, point_key: str, replication: int) -> int:
    """The docstring's recipe, written out with NumPy alone."""
    assert len(point_key) == 32 and int(point_key, 16) >= 0
    words = [int(point_key[i : i + 8], 16) for i in range(0, 32, 8)]
    sequence = np.random.SeedSequence(root, spawn_key=(*words, replication))
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def test_seed_column_follows_seed_sequence_of_root_point_and_replication(
    reference: simsim.SweepResult,
) -> None:
    cases = [simsim.sweeps.Case(name, s) for name, s in EXECUTOR_CASES.items()]
    points = expand_grid(EXECUTOR_GRID, cases)
    for row in reference.runs.to_dict("records"):
        point = points[row["point"]]
        assert point.case == row["case"]
        assert dict(point.params) == {axis: row[axis] for axis in EXECUTOR_GRID}
        seed = expected_seed(11, point.key, row["replication"])
        assert row["seed"] == seed == run_seed(11, point.key, row["replication"])
        assert 0 <= seed < 2**63
    assert reference.runs["seed"].nunique() == EXECUTOR_RUNS
    assert reference.seed == 11


def test_run_seed_matches_numpy_for_arbitrary_keys() -> None:
    for root in (0, 1, 2**32 + 5, 2**63 - 1):
        for key in ("0" * 32, "f" * 32, "0123456789abcdef" * 2):
            for replication in (0, 1, 7, 1000):
                assert run_seed(root, key, replication) == expected_seed(root, key, replication)
    assert run_seed(0, "0" * 32, 0) != run_seed(1, "0" * 32, 0)
    assert run_seed(0, "0" * 32, 0) != run_seed(0, "0" * 31 + "1", 0)
    assert run_seed(0, "0" * 32, 0) != run_seed(0, "0" * 32, 1)


def test_points_keep_their_seeds_and_results_when_the_grid_is_reordered_or_extended() -> None:
    first = simsim.sweep(
        BASE,
        {"workload.rate_per_s": [1.0, 3.0], "backend.decode_base_us": [6_000, 9_000]},
        replications=2,
        workers=1,
    )
    # Axes swapped, values reversed, a new rate added in the middle.
    second = simsim.sweep(
        BASE,
        {"backend.decode_base_us": [9_000, 6_000], "workload.rate_per_s": [3.0, 2.0, 1.0]},
        replications=3,
        workers=1,
    )
    keys = ["workload.rate_per_s", "backend.decode_base_us", "replication"]
    old = first.runs.drop(columns="point").set_index(keys)
    new = second.runs.drop(columns="point").set_index(keys)
    assert len(new) == 2 * 3 * 3
    pdt.assert_frame_equal(new.loc[old.index], old)
    assert len(set(second.runs["seed"])) == len(second.runs)


def test_a_different_root_seed_gives_different_runs() -> None:
    grid = {"workload.rate_per_s": [2.0]}
    zero = simsim.sweep(BASE, grid, replications=2, seed=0, workers=1)
    again = simsim.sweep(BASE, grid, replications=2, seed=0, workers=1)
    one = simsim.sweep(BASE, grid, replications=2, seed=1, workers=1)
    pdt.assert_frame_equal(zero.runs, again.runs)
    assert set(zero.runs["seed"]).isdisjoint(one.runs["seed"])
    assert (zero.runs["ttft_us_mean"] != one.runs["ttft_us_mean"]).all()
    assert (zero.runs["makespan_us"] != one.runs["makespan_us"]).all()


def test_the_same_settings_under_another_case_name_get_other_seeds() -> None:
    result = simsim.sweep(
        BASE, cases={"a": {"workload.count": 100}, "b": {"workload.count": 100}}, workers=1
    )
    seeds = result.runs.set_index(["case", "replication"])["seed"]
    assert set(seeds.loc["a"]).isdisjoint(seeds.loc["b"])


# ---------------------------------------------------------------- table shape


def test_runs_frame_columns_order_and_dtypes(reference: simsim.SweepResult) -> None:
    runs = reference.runs
    axes = list(EXECUTOR_GRID)
    metrics = scenario_metrics()
    assert list(runs.columns) == ["point", "case", *axes, "replication", "seed", *metrics]
    for column in ("point", "replication", "seed"):
        assert runs[column].dtype == np.int64
    # Sorted by point then replication; cases slowest, the last axis fastest.
    assert runs["point"].tolist() == [p for p in range(8) for _ in range(2)]
    assert runs["replication"].tolist() == [0, 1] * 8
    assert runs["case"].tolist() == ["prefill_first"] * 8 + ["mixed"] * 8
    assert runs["workload.rate_per_s"].tolist() == ([2.0] * 4 + [6.0] * 4) * 2
    assert runs["batching.max_active_requests"].tolist() == [2, 2, 6, 6] * 4


def test_summary_columns_and_student_t_intervals_from_the_runs() -> None:
    stats = pytest.importorskip("scipy.stats")
    result = simsim.sweep(
        BASE,
        {"workload.rate_per_s": [1.0, 4.0]},
        cases={"slow": {"backend.decode_base_us": 10_000}, "fast": {}},
        replications=4,
        confidence=0.9,
        ttft_slo_us=500_000,
        workers=1,
    )
    metrics = scenario_metrics(ttft_slo_us=500_000)
    assert "slo_attainment" in metrics and "goodput_requests_per_s" in metrics
    summary = result.summary
    assert list(summary.columns) == [
        "point",
        "case",
        "workload.rate_per_s",
        "metric",
        "mean",
        "std",
        "count",
        "ci_low",
        "ci_high",
    ]
    assert len(summary) == 4 * len(metrics)
    assert summary["metric"].tolist() == metrics * 4
    assert result.confidence == 0.9 and result.replications == 4
    quantile = stats.t.ppf(0.95, 3)
    for row in summary.to_dict("records"):
        values = result.runs.loc[result.runs["point"] == row["point"], row["metric"]]
        assert row["case"] == result.runs.loc[values.index[0], "case"]
        assert row["count"] == 4
        mean, std = values.mean(), values.std(ddof=1)
        half = quantile * std / math.sqrt(4)
        assert row["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-12)
        assert row["std"] == pytest.approx(std, rel=1e-9, abs=1e-9)
        # Clipped to what the metric can take: 0 and up, at most 1 for the attainment.
        lowest, highest = metric_range(row["metric"])
        low, high = min(max(mean - half, lowest), highest), max(min(mean + half, highest), lowest)
        assert row["ci_low"] == pytest.approx(low, rel=1e-9, abs=1e-6)
        assert row["ci_high"] == pytest.approx(high, rel=1e-9, abs=1e-6)
    ttft = summary.query("metric == 'ttft_us_p90'")
    assert (ttft["std"] > 0).all() and (ttft["ci_low"] < ttft["ci_high"]).all()
    counts = summary.query("metric == 'requests'")
    assert (counts[["mean", "ci_low", "ci_high"]] == 120.0).all().all()
    assert (counts["std"] == 0.0).all()


def test_summary_intervals_stay_within_each_metrics_range() -> None:
    # A wide spread between replications and an SLO that about half the requests meet:
    # the unclipped t intervals reach below 0 (latencies) and above 1 (attainment).
    result = simsim.sweep(
        synthetic_model,
        {"load": [0.5, 1.0]},
        cases={"wide": {"spread": 2_000.0}},
        replications=3,
        seed=2,
        ttft_slo_us=1_000,
        workers=1,
    )
    summary = result.summary
    unclipped = [
        mean_interval(result.runs.loc[result.runs["point"] == row["point"], row["metric"]])
        for row in summary.to_dict("records")
    ]
    assert any(interval.low < 0 for interval in unclipped)
    metrics = summary["metric"].tolist()
    assert any(i.high > 1 for i, m in zip(unclipped, metrics, strict=True) if m == "slo_attainment")
    assert (summary["ci_low"].dropna() >= 0).all()
    attainment = summary[summary["metric"] == "slo_attainment"]
    assert (attainment["ci_high"] <= 1).all()
    for interval, row in zip(unclipped, summary.to_dict("records"), strict=True):
        lowest, highest = metric_range(row["metric"])
        assert row["ci_low"] == min(max(interval.low, lowest), highest)
        assert row["ci_high"] == max(min(interval.high, highest), lowest)
        assert row["mean"] == interval.mean


def test_point_and_axis_columns_have_the_same_dtypes_in_runs_and_summary(
    tmp_path: Path,
) -> None:
    grid = {"load": [1.0, 2.0], "slots": [1, 2]}  # all numeric: once read as floats
    result = simsim.sweep(synthetic_model, grid, replications=2, workers=1, out=tmp_path)
    keys = ["point", *grid]
    assert result.summary[keys].dtypes.to_dict() == result.runs[keys].dtypes.to_dict()
    assert result.summary["point"].dtype == np.int64
    assert result.summary["slots"].dtype == np.int64
    # The same in the tables written to the folder, as pandas reads them back.
    runs_csv, summary_csv = (
        pd.read_csv(tmp_path / "runs.csv"),
        pd.read_csv(tmp_path / "summary.csv"),
    )
    assert summary_csv[keys].dtypes.to_dict() == runs_csv[keys].dtypes.to_dict()
    assert summary_csv["point"].dtype == np.int64
    # With cases and without a grid too.
    cased = simsim.sweep(synthetic_model, cases={"a": {}, "b": {"spread": 5.0}}, replications=2)
    assert cased.summary["point"].dtype == cased.runs["point"].dtype == np.int64


def test_one_replication_gives_nan_intervals() -> None:
    result = simsim.sweep(BASE, {"workload.rate_per_s": [2.0]}, replications=1, workers=1)
    summary = result.summary
    assert (summary["count"] == 1).all()
    assert summary[["std", "ci_low", "ci_high"]].isna().all().all()
    means = summary.set_index("metric")["mean"]
    np.testing.assert_array_equal(means.to_numpy(), result.runs.loc[0, scenario_metrics()])


def test_no_grid_and_no_cases_run_the_base_scenario() -> None:
    result = simsim.sweep(BASE, replications=2, seed=3, workers=1)
    assert list(result.runs.columns) == ["point", "replication", "seed", *scenario_metrics()]
    assert result.axes == () and result.cases == () and result.load is None
    assert list(result.summary.columns[:2]) == ["point", "metric"]
    assert_rows_match_direct_runs(result, BASE)


def test_load_axis_defaults_to_the_rate_axis_and_can_be_chosen() -> None:
    grid = {"backend.decode_base_us": [8_000], "workload.rate_per_s": [2.0]}
    assert simsim.sweep(BASE, grid, replications=1, workers=1).load == "workload.rate_per_s"
    chosen = simsim.sweep(BASE, grid, replications=1, workers=1, load="backend.decode_base_us")
    assert chosen.load == "backend.decode_base_us"


def test_aggregate_leaves_out_nan_values() -> None:
    runs = pd.DataFrame(
        {
            "point": [0, 0, 0, 1, 1, 1],
            "replication": [0, 1, 2, 0, 1, 2],
            "seed": [1, 2, 3, 4, 5, 6],
            "ttft_us_mean": [1.0, math.nan, 3.0, math.nan, math.nan, 7.0],
        }
    )
    summary = aggregate(runs, ["point"], confidence=0.95)
    assert list(summary.columns) == ["point", "metric", "mean", "std", "count", "ci_low", "ci_high"]
    first, second = summary.to_dict("records")
    assert first["count"] == 2 and first["mean"] == 2.0
    assert first["ci_high"] == pytest.approx(2.0 + student_t_quantile(0.975, 1) * 1.0)
    assert first["ci_low"] == 0.0  # 2.0 - 12.7 clipped: a TTFT is never below 0
    assert second["count"] == 1 and second["mean"] == 7.0 and math.isnan(second["ci_low"])


def test_aggregate_clips_known_metrics_and_leaves_a_callers_own_columns_alone() -> None:
    runs = pd.DataFrame(
        {
            "point": [0, 0, 0],
            "replication": [0, 1, 2],
            "seed": [1, 2, 3],
            "ttft_us_p99": [1.0, 2.0, 30.0],
            "slo_attainment": [0.5, 1.0, 1.0],
            "profit": [1.0, 2.0, 30.0],
        }
    )
    summary = aggregate(runs, ["point"]).set_index("metric")
    free = mean_interval([1.0, 2.0, 30.0])
    assert summary.loc["ttft_us_p99", "ci_low"] == 0.0
    assert summary.loc["slo_attainment", "ci_high"] == 1.0
    assert summary.loc["profit", "ci_low"] == free.low < 0


def test_runs_that_cannot_measure_a_metric_are_left_out_of_its_count() -> None:
    result = simsim.sweep(
        sometimes_unmeasured_model,
        {"load": [2.0], "odd_fail": [True]},
        replications=6,
        seed=13,
        workers=1,
    )
    odd = result.runs["seed"] % 2 == 1
    assert 0 < odd.sum() < 6  # both kinds of run, for this root seed
    assert result.runs.loc[odd, "ttft_us_mean"].isna().all()
    assert result.runs.loc[~odd, "ttft_us_mean"].notna().all()
    summary = result.summary.set_index("metric")
    assert summary.loc["ttft_us_mean", "count"] == (~odd).sum()
    assert summary.loc["requests", "count"] == 6
    expected = mean_interval(result.runs.loc[~odd, "ttft_us_mean"], 0.95)
    assert summary.loc["ttft_us_mean", "mean"] == pytest.approx(expected.mean)
    assert summary.loc["ttft_us_mean", "ci_high"] == pytest.approx(expected.high)


# ---------------------------------------------------------------- kinds of settings


def test_grid_over_rate_and_cost_model_matches_direct_runs() -> None:
    result = simsim.sweep(
        BASE,
        {"workload.rate_per_s": [1.0, 5.0], "backend.decode_base_us": [4_000, 12_000]},
        replications=2,
        seed=9,
        workers=1,
    )
    assert "case" not in result.runs.columns
    assert_rows_match_direct_runs(result, BASE)
    # The cost model setting really reaches the backend: slower decode, longer e2e.
    e2e = result.summary.query("metric == 'e2e_latency_us_mean'")
    by_decode = e2e.groupby("backend.decode_base_us")["mean"].mean()
    assert by_decode[12_000] > 2 * by_decode[4_000]


def test_grid_over_slots_and_policy_with_a_batching_case_matches_direct_runs() -> None:
    cases = {
        "batching": {"scenario.engine": "batching", "batching.max_batch_tokens": 512},
        "batching-small-budget": {"scenario.engine": "batching", "batching.max_batch_tokens": 64},
    }
    result = simsim.sweep(
        BASE,
        {"batching.max_active_requests": [1, 8], "batching.policy": ["prefill_first", "mixed"]},
        cases=cases,
        replications=2,
        seed=4,
        workers=1,
        ttft_slo_us=300_000,
        tpot_slo_us=9_000.0,
        percentiles=(50, 95, 99.9),
    )
    assert result.cases == tuple(cases)
    options = {"ttft_slo_us": 300_000, "tpot_slo_us": 9_000.0, "percentiles": (50, 95, 99.9)}
    metrics = scenario_metrics(**options)
    assert "ttft_us_p99.9" in metrics and "ttft_us_p99" not in metrics
    assert list(result.runs.columns[6:]) == metrics
    assert_rows_match_direct_runs(result, BASE, cases, **options)


def test_a_toml_path_resolves_its_relative_trace_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = EXAMPLES / "small.toml"
    monkeypatch.chdir(tmp_path)
    result = simsim.sweep(
        path, {"workload.arrivals.rate_per_s": [4.0, 16.0]}, replications=2, workers=1
    )
    document = tomllib.loads(path.read_text(encoding="utf-8"))
    assert_rows_match_direct_runs(result, document, base_dir=path.parent)
    # Two inline requests, the trace's rows and 20 generated ones, in every run.
    assert result.runs["requests"].nunique() == 1 and result.runs["requests"].iloc[0] > 22


def test_percentile_labels_name_the_summary_columns() -> None:
    assert [percentile_label(q) for q in (50, 95.0, 99.9, 99.99)] == [
        "p50",
        "p95",
        "p99.9",
        "p99.99",
    ]
    frame = summarize(finished_requests(np.arange(1, 101, dtype=np.int64)), percentiles=[95, 99.9])
    assert frame.loc["ttft_us_p95", "value"] == pytest.approx(95.05)
    assert frame.loc["ttft_us_p99.9", "value"] == pytest.approx(99.901)
    assert "ttft_us_p50" not in frame.index


@pytest.mark.parametrize(
    ("key", "values"),
    [
        (
            "workload.arrivals",
            [
                {"process": "poisson", "rate_per_s": 2.0},
                {"process": "gamma", "rate_per_s": 2.0, "cv": 3.0},
            ],
        ),
        ("workload.output_tokens", [[1, 8], [1, 32]]),
        (
            "workload.prompt_tokens",
            [
                {"distribution": "fixed", "value": 64},
                {"distribution": "uniform", "low": 16, "high": 256},
            ],
        ),
    ],
)
def test_grid_over_list_or_table_valued_keys(key: str, values: list[Any]) -> None:
    base = copy.deepcopy(BASE)
    if key == "workload.arrivals":
        del base["workload"]["rate_per_s"]  # give either rate_per_s or arrivals
    result = simsim.sweep(base, {key: values}, replications=2, workers=1)
    assert result.runs[key].tolist() == [values[0], values[0], values[1], values[1]]
    assert len(result.summary) == 2 * len(scenario_metrics())


def test_a_model_receives_its_case_settings(calls: list[tuple[dict[str, Any], int]]) -> None:
    simsim.sweep(
        counting_model,
        {"load": [1.0]},
        cases={"quiet": {"spread": 1.0}, "noisy": {"spread": 500.0}},
        replications=1,
        workers=1,
    )
    assert sorted(params.get("spread", -1.0) for params, _ in calls) == [1.0, 500.0]


# ---------------------------------------------------------------- bad input


def record_progress(log: list[tuple[int, int]]) -> Callable[[int, int], None]:
    return lambda done, total: log.append((done, total))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"grid": {"load": []}}, ValueError, "grid.load"),
        ({"grid": {"load": [1.0, 2.0, 1.0]}}, ValueError, "twice"),
        ({"grid": {"load": 2.0}}, TypeError, "list"),
        ({"grid": {"load": "1.0"}}, TypeError, "list"),
        ({"grid": {"load": [math.inf]}}, ValueError, "finite"),
        ({"grid": {"load": [None]}}, TypeError, "grid.load"),
        ({"grid": {"": [1.0]}}, ValueError, "dotted"),
        ({"grid": {"scenario.seed": [1, 2]}}, ScenarioError, "scenario.seed"),
        ({"cases": {"c": {"scenario.seed": 3}}}, ScenarioError, "scenario.seed"),
        ({"cases": {"c": {"load": 1.0}}}, ValueError, "also a grid axis"),
        ({"replications": 0}, ValueError, "replications"),
        ({"replications": -1}, ValueError, "replications"),
        ({"replications": True}, ValueError, "replications"),
        ({"replications": 2.0}, ValueError, "replications"),
        ({"confidence": 0.0}, ValueError, "confidence"),
        ({"confidence": 1.0}, ValueError, "confidence"),
        ({"confidence": 95}, ValueError, "confidence"),
        ({"confidence": True}, ValueError, "confidence"),
        ({"workers": 0}, ValueError, "workers"),
        ({"workers": -2}, ValueError, "workers"),
        ({"workers": True}, ValueError, "workers"),
        ({"workers": 2, "executor": "x"}, ValueError, "not both"),
        ({"executor": object()}, TypeError, "Executor"),
        ({"executor": concurrent.futures.ProcessPoolExecutor}, TypeError, "Executor"),
        ({"load": "workload.rate_per_s"}, ValueError, "load"),
        ({"seed": -1}, ValueError, "seed"),
        ({"percentiles": [100]}, ValueError, "percentiles"),
        # Sizes no sweep means, refused before a point is made.
        ({"replications": 10**12}, ValueError, r"replications must be at most 1,000,000"),
        (
            {"grid": {"load": list(range(1_000)), "other": list(range(2_000))}},
            ValueError,
            r"the grid \(1000 values of load x 2000 values of other\), with one replication, "
            r"is 2,000,000 runs, more than a sweep may make \(1,000,000",
        ),
        (
            {"grid": {"load": list(range(1_000))}, "replications": 1_001},
            ValueError,
            r"1000 points x 1001 replications is 1,001,000 runs",
        ),
    ],
)
def test_bad_sweep_arguments_are_refused_before_anything_runs(
    options: dict[str, Any],
    error: type[Exception],
    message: str,
    calls: list[tuple[dict[str, Any], int]],
    tmp_path: Path,
) -> None:
    arguments: dict[str, Any] = {"grid": {"load": [1.0, 2.0]}, "replications": 2, "workers": 1}
    arguments.update(options)
    if arguments.get("executor") is not None and "workers" not in options:
        del arguments["workers"]
    progress: list[tuple[int, int]] = []
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        simsim.sweep(counting_model, **arguments, out=out, progress=record_progress(progress))
    assert calls == []
    assert not list(out.glob("runs/*.json"))
    assert all(done == 0 for done, _ in progress)


def test_a_both_executor_and_workers_call_never_touches_the_executor() -> None:
    executor = ReorderingExecutor(batch=1, order="reverse")
    with pytest.raises(ValueError, match="not both"):
        simsim.sweep(synthetic_model, {"load": [1.0]}, executor=executor, workers=2)
    assert executor.completed == [] and not executor._held


@pytest.mark.parametrize(
    ("grid", "cases", "key"),
    [
        ({"workload.rate_per_sec": [1.0]}, None, "workload.rate_per_sec"),
        ({"backend.decode_us": [1_000]}, None, "backend.decode_us"),
        ({"workload.rate_per_s": [1.0, -1.0]}, None, "workload.rate_per_s"),
        ({"workload.rate_per_s": [1.0, "fast"]}, None, "workload.rate_per_s"),
        ({"batching.policy": ["prefill_first", "greedy"]}, "batching", "batching.policy"),
        ({"batching.max_active_requests": [4]}, None, 'only for engine = "batching"'),
        ({"workload.rate_per_s": [1.0]}, "typo", "scenario.engin"),
    ],
)
def test_invalid_scenario_settings_name_the_key_and_nothing_runs(
    grid: dict[str, list[Any]], cases: str | None, key: str, tmp_path: Path
) -> None:
    case_settings = {
        None: None,
        "batching": {
            "batching": {"scenario.engine": "batching", "batching.max_active_requests": 2}
        },
        "typo": {"typo": {"scenario.engin": "batching"}},
    }[cases]
    progress: list[tuple[int, int]] = []
    with pytest.raises(ScenarioError, match=re.escape(key)) as raised:
        simsim.sweep(
            BASE,
            grid,
            cases=case_settings,
            workers=1,
            out=tmp_path / "out",
            progress=record_progress(progress),
        )
    assert isinstance(raised.value, ValueError)
    assert progress == []
    assert not (tmp_path / "out").exists()


def test_a_missing_scenario_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        simsim.sweep(tmp_path / "missing.toml", workers=1)
    with pytest.raises(TypeError, match="scenario"):
        simsim.sweep(42, workers=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- results folder


def test_out_folder_holds_one_file_per_run_and_both_tables(
    tmp_path: Path, calls: list[tuple[dict[str, Any], int]]
) -> None:
    grid = {"load": [1.0, 2.0, 3.0]}
    result = simsim.sweep(counting_model, grid, replications=2, seed=8, workers=1, out=tmp_path)
    assert len(calls) == 6
    files = sorted((tmp_path / "runs").glob("*.json"))
    assert len(files) == 6
    points = {p.key: p for p in expand_grid(grid)}
    for file in files:
        record = json.loads(file.read_text(encoding="utf-8"))
        point = points[record["key"]]
        assert file.name == f"{point.key}-{record['replication']}.json"
        assert record["params"] == dict(point.params)
        assert record["seed"] == expected_seed(8, point.key, record["replication"])
        row = result.runs.query(
            f"point == {point.index} and replication == {record['replication']}"
        )
        assert record["seed"] == row["seed"].item()
        assert record["metrics"] == pytest.approx(row[list(record["metrics"])].iloc[0].to_dict())
    runs_csv = pd.read_csv(tmp_path / "runs.csv")
    pdt.assert_frame_equal(runs_csv, result.runs, check_dtype=False)
    summary_csv = pd.read_csv(tmp_path / "summary.csv")
    pdt.assert_frame_equal(summary_csv, result.summary, check_dtype=False)


def test_out_folder_is_reused_and_extended(
    tmp_path: Path, calls: list[tuple[dict[str, Any], int]]
) -> None:
    first = simsim.sweep(
        counting_model, {"load": [1.0, 2.0]}, replications=2, workers=1, out=tmp_path
    )
    assert len(calls) == 4
    calls.clear()
    progress: list[tuple[int, int]] = []
    again = simsim.sweep(
        counting_model,
        {"load": [1.0, 2.0]},
        replications=2,
        workers=1,
        out=tmp_path,
        progress=record_progress(progress),
    )
    assert calls == []
    assert_same_result(again, first)
    assert progress[-1] == (4, 4)
    # A new value and a third replication: only the runs not on disk run.
    extended = simsim.sweep(
        counting_model, {"load": [1.0, 2.0, 4.0]}, replications=3, workers=1, out=tmp_path
    )
    assert sorted((p["load"], s) for p, s in calls) == sorted(
        (row["load"], row["seed"])
        for row in extended.runs.to_dict("records")
        if row["load"] == 4.0 or row["replication"] == 2
    )
    assert len(calls) == 5
    assert len(list((tmp_path / "runs").glob("*.json"))) == 9
    fresh = simsim.sweep(counting_model, {"load": [1.0, 2.0, 4.0]}, replications=3, workers=1)
    assert_same_result(extended, fresh)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"scenario": synthetic_model},
        {"percentiles": (50, 99)},
        {"ttft_slo_us": 5_000},
    ],
    ids=["seed", "model", "percentiles", "slo"],
)
def test_a_folder_from_a_different_sweep_is_refused(
    tmp_path: Path, change: dict[str, Any], calls: list[tuple[dict[str, Any], int]]
) -> None:
    arguments: dict[str, Any] = {"scenario": counting_model, "seed": 0, "workers": 1}
    simsim.sweep(grid={"load": [1.0]}, replications=1, out=tmp_path, **arguments)
    calls.clear()
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    with pytest.raises(SweepFolderError, match="different sweep"):
        simsim.sweep(grid={"load": [1.0]}, replications=1, out=tmp_path, **{**arguments, **change})
    assert calls == []
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before


def test_a_folder_from_a_different_base_scenario_is_refused(tmp_path: Path) -> None:
    simsim.sweep(BASE, {"workload.rate_per_s": [2.0]}, replications=1, workers=1, out=tmp_path)
    other = with_settings(BASE, {"workload.count": 100})
    with pytest.raises(SweepFolderError, match="different sweep"):
        simsim.sweep(other, {"workload.rate_per_s": [2.0]}, replications=1, workers=1, out=tmp_path)


def test_an_interrupted_folder_is_completed_and_equals_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    grid = {"workload.rate_per_s": [1.0, 3.0], "backend.decode_base_us": [6_000, 9_000]}
    options: dict[str, Any] = {"replications": 2, "seed": 21, "workers": 1}
    uninterrupted = simsim.sweep(BASE, grid, **options)
    simsim.sweep(BASE, grid, **options, out=tmp_path)
    files = sorted((tmp_path / "runs").glob("*.json"))
    assert len(files) == 8
    for file in files[::3]:
        file.unlink()
    (tmp_path / "runs.csv").unlink()
    (tmp_path / "summary.csv").unlink()
    progress: list[tuple[int, int]] = []
    completed = simsim.sweep(
        BASE, grid, **options, out=tmp_path, progress=record_progress(progress)
    )
    assert_same_result(completed, uninterrupted)
    assert len(list((tmp_path / "runs").glob("*.json"))) == 8
    assert progress[-1] == (8, 8)
    # A pool finishing the folder gives the same tables too.
    for file in files[1::3]:
        file.unlink()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        pooled = simsim.sweep(BASE, grid, replications=2, seed=21, executor=pool, out=tmp_path)
    assert_same_result(pooled, uninterrupted)
    pdt.assert_frame_equal(
        pd.read_csv(tmp_path / "runs.csv"),
        uninterrupted.runs,
        check_dtype=False,
    )


def _rewrite(path: Path, **changes: Any) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**record, **changes}), encoding="utf-8")


@pytest.mark.parametrize(
    ("tamper", "disagreement"),
    [
        (
            lambda run, other: _rewrite(run, key=json.loads(other.read_text())["key"]),
            r"stores key '[0-9a-f]{32}' where its name says '[0-9a-f]{32}'",
        ),
        (lambda run, other: _rewrite(run, replication=1), r"replication 1 where"),
        (lambda run, other: _rewrite(run, replication=True), r"replication True where"),
        (lambda run, other: _rewrite(run, seed=12345), r"seed 12345 where this sweep's"),
        # Another run's file under this run's name: its key or replication, and its seed.
        (lambda run, other: run.write_bytes(other.read_bytes()), r"seed \d+ where"),
    ],
    ids=["key", "replication", "replication_true", "seed", "another_runs_file"],
)
def test_a_run_file_that_disagrees_with_its_name_is_refused_not_loaded(
    tmp_path: Path,
    tamper: Callable[[Path, Path], None],
    disagreement: str,
    calls: list[tuple[dict[str, Any], int]],
) -> None:
    grid = {"load": [1.0, 2.0]}
    simsim.sweep(counting_model, grid, replications=2, seed=8, workers=1, out=tmp_path)
    runs = sorted((tmp_path / "runs").glob("*.json"))
    zero = [run for run in runs if run.name.endswith("-0.json")]
    # A run of the other point, and the other replication.
    key = zero[0].name.split("-")[0]
    other = next(run for run in runs if not run.name.startswith(key) and run not in zero)
    tamper(zero[0], other)
    before = {run.name: run.read_bytes() for run in runs}
    calls.clear()
    with pytest.raises(SweepFolderError) as refused:
        simsim.sweep(counting_model, grid, replications=2, seed=8, workers=1, out=tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{zero[0]}: the run file does not match its name: it stores ")
    assert re.search(disagreement, message), message
    assert message.endswith("(delete the file to run that run again)")
    assert calls == []  # refused before anything ran
    assert {run.name: run.read_bytes() for run in runs} == before


def _without_metric_order(path: Path) -> None:
    """Rewrite a run file as simsim wrote them before they kept the metrics' order."""
    record = json.loads(path.read_text(encoding="utf-8"))
    del record["metric_order"]
    path.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")


def resumed_from_files_without_order(
    document: Mapping[str, Any], folder: Path
) -> tuple[simsim.SweepResult, simsim.SweepResult]:
    """A sweep of *document* to the end in *folder*, and the same sweep again once its run
    files are as simsim wrote them before they kept the metrics' order."""
    grid = {"workload.rate_per_s": [2.0, 8.0]}
    options: dict[str, Any] = {"replications": 2, "seed": 3, "workers": 1, "out": folder}
    fresh = simsim.sweep(document, grid, **options)
    for run in (folder / "runs").glob("*.json"):
        _without_metric_order(run)
    resumed = simsim.sweep(document, grid, **options)
    assert resumed.reused == 4
    return fresh, resumed


def test_run_files_without_a_metric_order_are_loaded_with_every_metric(tmp_path: Path) -> None:
    # A single server reports summarize's usual metrics: the tables are as before.
    single = with_settings(BASE, {"workload.count": 40})
    fresh, resumed = resumed_from_files_without_order(single, tmp_path / "single")
    assert_same_result(resumed, fresh)
    # A cluster's load-balance rows are kept too, after the usual ones, by name.
    cluster = with_settings(single, {"cluster.replicas": 2})
    fresh, resumed = resumed_from_files_without_order(cluster, tmp_path / "cluster")
    balance = [c for c in fresh.runs.columns if c.startswith(("replicas", "replica_"))]
    assert len(balance) == 8
    columns = ["point", "workload.rate_per_s", "replication", "seed"]
    assert list(resumed.runs.columns) == [*columns, *scenario_metrics(), *sorted(balance)]
    pdt.assert_frame_equal(resumed.runs, fresh.runs[list(resumed.runs.columns)])


def _drop_metric(path: Path, name: str) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    del record["metrics"][name]
    record["metric_order"].remove(name)
    path.write_text(json.dumps(record), encoding="utf-8")


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        (lambda run: run.write_text('{"key": "', encoding="utf-8"), "JSONDecodeError"),
        (
            lambda run: _drop_metric(run, "ttft_us_p99"),
            "ValueError: it lacks the metric 'ttft_us_p99', which every run of the sweep has",
        ),
        (lambda run: _rewrite(run, metrics=[1.0, 2.0]), "TypeError: metrics must be a table"),
        (lambda run: _rewrite(run, metric_order="requests"), "ValueError: metric_order must"),
        (
            lambda run: _rewrite(run, metric_order=json.loads(run.read_text())["metric_order"][1:]),
            f"ValueError: metric_order must name each of the file's {len(metric_names())} metrics",
        ),
        (
            lambda run: _rewrite(
                run, metric_order=["requests", *json.loads(run.read_text())["metric_order"]]
            ),
            "ValueError: metric_order must",
        ),
    ],
    ids=[
        "not_json",
        "metric_missing",
        "metrics_not_a_table",
        "order_not_a_list",
        "order_lacks_one",
        "order_repeats_one",
    ],
)
def test_a_damaged_run_file_is_refused_naming_it(
    tmp_path: Path,
    tamper: Callable[[Path], None],
    error: str,
    calls: list[tuple[dict[str, Any], int]],
) -> None:
    grid = {"load": [1.0]}
    simsim.sweep(counting_model, grid, replications=1, workers=1, out=tmp_path)
    (run,) = sorted((tmp_path / "runs").glob("*.json"))
    tamper(run)
    damaged = run.read_bytes()
    calls.clear()
    with pytest.raises(SweepFolderError) as refused:
        simsim.sweep(counting_model, grid, replications=1, workers=1, out=tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{run}: not a finished run of this sweep ({error}")
    assert message.endswith("); delete the file to run it again")
    assert calls == []
    assert run.read_bytes() == damaged


def test_sigterm_stops_a_sweep_in_python_with_sweep_stopped_and_keeps_its_runs(
    tmp_path: Path,
) -> None:
    # In a child interpreter: were the signal not handled, it would end the test run.
    script = textwrap.dedent(
        """
        import json, os, signal, sys
        import simsim
        from simsim.results import requests_frame
        from simsim.sweeps import SweepStopped

        def model(settings, seed):
            if settings["n"] == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return requests_frame([])

        try:
            simsim.sweep(model, {"n": [1, 2, 3, 4]}, replications=1, workers=1, out=sys.argv[1])
        except SweepStopped as error:
            print(json.dumps({
                "message": str(error),
                "signal": error.signal_name,
                "exit_status": error.exit_status,
                "is_keyboard_interrupt": isinstance(error, KeyboardInterrupt),
                "restored": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
            }))
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=functools.partial(signal.signal, signal.SIGTERM, signal.SIG_DFL),
    )
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert json.loads(child.stdout) == {
        "message": "stopped by SIGTERM",
        "signal": "SIGTERM",
        "exit_status": 143,
        "is_keyboard_interrupt": True,
        "restored": True,
    }
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2  # the runs before the signal


#: The signals :func:`signalling_model` sent, as the test's own handler received them.
RECEIVED: list[int] = []


def signalling_model(params: dict[str, Any], seed: int) -> pd.DataFrame:
    """:func:`synthetic_model`, after sending this process SIGTERM and SIGHUP."""
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGHUP)
    return synthetic_model(params, seed)


def test_a_programs_own_signal_handlers_and_an_ignored_sighup_are_left_alone() -> None:
    def record(number: int, frame: object) -> None:
        RECEIVED.append(number)

    RECEIVED.clear()
    # A handler of the program's own for SIGTERM, and SIGHUP ignored as under nohup.
    previous = signal.signal(signal.SIGTERM, record), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        result = simsim.sweep(signalling_model, {"load": [1.0, 2.0]}, replications=1, workers=1)
        assert len(result.runs) == 2  # ran to the end: the signals were not the sweep's
        assert RECEIVED == [signal.SIGTERM, signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is record
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGHUP, previous[1])


def test_sweep_stopped_names_its_signal_and_exit_status() -> None:
    stopped = SweepStopped(signal.SIGHUP)
    assert isinstance(stopped, KeyboardInterrupt)
    assert (str(stopped), stopped.signal_name, stopped.exit_status) == (
        "stopped by SIGHUP",
        "SIGHUP",
        129,
    )


def test_progress_counts_runs_done_and_runs_in_all() -> None:
    progress: list[tuple[int, int]] = []
    simsim.sweep(
        synthetic_model,
        {"load": [1.0, 2.0]},
        replications=3,
        workers=1,
        progress=record_progress(progress),
    )
    assert progress[-1] == (6, 6)
    done = [d for d, _ in progress]
    assert done == sorted(done) and all(total == 6 for _, total in progress)


# ---------------------------------------------------------------- capacity search


def assert_verdicts_follow_the_rule(result: simsim.CapacityResult) -> None:
    """Each evaluation's verdict is what the module docstring's rule says of its CIs."""
    for row in result.evaluations.to_dict("records"):
        meets = all(row[f"{m}_ci_high"] <= limit for m, limit in result.targets.items())
        misses = any(row[f"{m}_ci_low"] > limit for m, limit in result.targets.items())
        assert row["verdict"] == ("misses" if misses else "meets" if meets else "uncertain")


def verdict_of(result: simsim.CapacityResult, value: float | None) -> str:
    rows = result.evaluations[result.evaluations["value"] == value]
    assert len(rows) >= 1, value
    return str(rows["verdict"].iloc[-1])


def test_capacity_search_on_a_single_slot_brackets_the_rate_where_the_target_flips() -> None:
    result = simsim.capacity_search(
        BASE,
        "workload.rate_per_s",
        low=0.5,
        high=12.0,
        tolerance=0.25,
        targets={"ttft_us_p90": 1_000_000},
        replications=3,
        workers=1,
    )
    assert result.status == "found" and result.find == "max"
    assert result.parameter == "workload.rate_per_s"
    assert result.targets == {"ttft_us_p90": 1_000_000.0}
    met, missed = result.interval
    assert met is not None and missed is not None
    assert 0.5 <= met < missed <= 12.0
    assert missed - met <= 0.25
    assert result.value == met
    assert verdict_of(result, met) == "meets"
    assert verdict_of(result, missed) in ("misses", "uncertain")
    assert_verdicts_follow_the_rule(result)
    evaluations = result.evaluations
    assert evaluations["value"].iloc[:2].tolist() == [0.5, 12.0]
    # Every value that meets lies below every value that does not: bisection was consistent.
    meeting = evaluations.loc[evaluations["verdict"] == "meets", "value"]
    failing = evaluations.loc[evaluations["verdict"] != "meets", "value"]
    assert meeting.max() == met and failing.min() == missed
    # The runs table is the sweep's: one row per run, the parameter as its axis.
    runs = result.runs
    assert "workload.rate_per_s" in runs.columns and "ttft_us_p90" in runs.columns
    assert len(runs) == evaluations.groupby("value")["replications"].max().sum()
    # The verdict's statistics are the runs' Student-t interval.
    row = evaluations[evaluations["value"] == met].iloc[-1]
    values = runs.loc[runs["workload.rate_per_s"] == met, "ttft_us_p90"]
    assert len(values) == row["replications"]
    interval = mean_interval(values, 0.95)
    assert row["ttft_us_p90_mean"] == pytest.approx(interval.mean)
    assert row["ttft_us_p90_ci_high"] == pytest.approx(interval.high)
    assert interval.high <= 1_000_000


def test_capacity_search_for_the_fewest_slots_gives_adjacent_integers() -> None:
    result = simsim.capacity_search(
        BASE,
        "batching.max_active_requests",
        low=1,
        high=16,
        find="min",
        settings={
            "scenario.engine": "batching",
            "workload.rate_per_s": 12.0,
            "backend.decode_per_active_sequence_us": 300,
        },
        targets={"ttft_us_p90": 1_000_000},
        replications=3,
        workers=1,
    )
    assert result.status == "found" and result.find == "min"
    missed, met = result.interval
    assert isinstance(met, int) and isinstance(missed, int)
    assert met - missed == 1
    assert result.value == met and 1 <= missed < met <= 16
    assert verdict_of(result, met) == "meets"
    assert verdict_of(result, missed) != "meets"
    assert verdict_of(result, 16) == "meets" and verdict_of(result, 1) == "misses"
    assert_verdicts_follow_the_rule(result)
    assert set(result.runs["batching.max_active_requests"]) <= set(range(1, 17))
    assert (result.runs["requests"] == 120).all()


def test_capacity_search_with_settings_runs_what_a_sweep_case_named_settings_runs() -> None:
    settings = {"scenario.engine": "batching", "workload.rate_per_s": 12.0}
    result = simsim.capacity_search(
        BASE,
        "batching.max_active_requests",
        low=1,
        high=8,
        find="min",
        settings=settings,
        targets={"ttft_us_p90": 1_000_000},
        replications=2,
        max_replications=2,
        workers=1,
    )
    assert result.status == "found"
    assert set(result.runs["case"]) == {"settings"}
    swept = simsim.sweep(
        BASE,
        {"batching.max_active_requests": sorted(set(result.evaluations["value"]))},
        cases={"settings": settings},
        replications=2,
        workers=1,
    )
    keys = ["batching.max_active_requests", "replication"]
    columns = ["case", "seed", *metric_names()]
    pdt.assert_frame_equal(
        result.runs.set_index(keys)[columns].sort_index(),
        swept.runs.set_index(keys)[columns].sort_index(),
    )
    assert_rows_match_direct_runs(swept, BASE, {"settings": settings})


@pytest.mark.parametrize(
    ("find", "limit", "status", "value", "interval"),
    [
        ("max", 50_000, "all_meet", 9.0, (9.0, None)),
        ("max", 10, "none_meet", None, (None, 1.0)),
        ("min", 50_000, "all_meet", 1.0, (None, 1.0)),
        ("min", 10, "none_meet", None, (9.0, None)),
    ],
)
def test_capacity_search_reports_when_the_whole_range_meets_or_misses(
    find: str, limit: float, status: str, value: float | None, interval: tuple[Any, Any]
) -> None:
    result = simsim.capacity_search(
        synthetic_model,
        "load",
        low=1.0,
        high=9.0,
        find=find,  # type: ignore[arg-type]
        targets={"ttft_us_mean": limit},
        replications=2,
        workers=1,
    )
    assert (result.status, result.value, result.interval) == (status, value, interval)
    verdicts = result.evaluations["verdict"].tolist()
    assert verdicts == (["meets", "meets"] if status == "all_meet" else ["misses", "misses"])
    assert_verdicts_follow_the_rule(result)


def test_capacity_search_on_a_model_finds_its_known_threshold() -> None:
    # Mean TTFT is 1000 * load plus a per-run offset (sd 100 us): 5000 us is met up to
    # about load 5, less the little the confidence interval needs.
    result = simsim.capacity_search(
        synthetic_model,
        "load",
        low=1.0,
        high=9.0,
        tolerance=0.05,
        targets={"ttft_us_mean": 5_000},
        settings={},
        replications=3,
        workers=1,
        seed=3,
    )
    met, missed = result.interval
    assert result.status == "found" and result.value == met
    assert met is not None and missed is not None
    assert 4.7 < met < missed < 5.3 and missed - met <= 0.05
    assert_verdicts_follow_the_rule(result)


def test_capacity_evaluations_show_intervals_clipped_at_0() -> None:
    # A per-run offset of sd 2000 us around a mean TTFT of 500-1000 us: two replications
    # give t intervals far below 0, which a latency cannot reach.
    result = simsim.capacity_search(
        synthetic_model,
        "load",
        low=0.5,
        high=1.0,
        targets={"ttft_us_mean": 50_000},
        settings={"spread": 2_000.0},
        replications=2,
        workers=1,
        seed=5,
    )
    evaluations = result.evaluations
    assert result.status == "all_meet"
    assert (evaluations["ttft_us_mean_ci_low"] == 0.0).any()
    assert (evaluations["ttft_us_mean_ci_low"] >= 0.0).all()
    runs = result.runs
    for row in evaluations.to_dict("records"):
        values = runs.loc[runs["load"] == row["value"], "ttft_us_mean"]
        free = mean_interval(values)
        assert row["ttft_us_mean_ci_low"] == max(free.low, 0.0)
        assert row["ttft_us_mean_ci_high"] == free.high


def test_uncertain_verdicts_run_more_replications_up_to_the_maximum() -> None:
    # With two replications the interval is wide (t = 63.7 at df = 1 and 99%): loads near
    # the 5000 us target are uncertain and need more runs. Load 5, probed first, sits
    # right on the target, so its 99% interval keeps covering it (but for a 1% chance).
    result = simsim.capacity_search(
        synthetic_model,
        "load",
        low=0,
        high=10,
        targets={"ttft_us_mean": 5_000},
        replications=2,
        max_replications=9,
        confidence=0.99,
        workers=1,
    )
    evaluations = result.evaluations
    assert_verdicts_follow_the_rule(result)
    assert (evaluations["replications"] >= 2).all() and (evaluations["replications"] <= 9).all()
    assert (evaluations["replications"] > 2).any()
    uncertain = evaluations[evaluations["verdict"] == "uncertain"]
    assert len(uncertain) >= 1
    assert (uncertain["replications"] == 9).all()
    # Runs on disk match the replications each value needed.
    per_value = result.runs.groupby("load").size()
    needed = evaluations.groupby("value")["replications"].max()
    pdt.assert_series_equal(per_value, needed, check_names=False, check_index_type=False)
    # An uncertain value is never the answer: the answer meets with confidence.
    assert result.value not in set(uncertain["value"])
    assert verdict_of(result, result.value) == "meets"


def test_a_run_that_cannot_measure_a_target_metric_misses() -> None:
    # Above load 5 no request gets a first token; the limit itself is never binding.
    result = simsim.capacity_search(
        sometimes_unmeasured_model,
        "load",
        low=1.0,
        high=9.0,
        tolerance=0.5,
        targets={"ttft_us_p99": 1e12},
        replications=2,
        workers=1,
    )
    assert result.status == "found"
    met, missed = result.interval
    assert met is not None and missed is not None
    assert met <= 5.0 < missed and missed - met <= 0.5
    evaluations = result.evaluations.set_index("value")
    assert evaluations.loc[9.0, "verdict"] == "misses"
    assert math.isnan(evaluations.loc[9.0, "ttft_us_p99_mean"])
    assert evaluations.loc[1.0, "verdict"] == "meets"


def test_uncertain_at_most_replications_counts_as_a_miss() -> None:
    # The target equals the true mean whatever the spread: a 99.9% interval covers it
    # (but for a 0.1% chance at each end), so no replication count decides.
    result = simsim.capacity_search(
        synthetic_model,
        "spread",
        low=200.0,
        high=400.0,
        targets={"ttft_us_mean": 1_000},
        replications=2,
        max_replications=4,
        confidence=0.999,
        workers=1,
    )
    assert result.status == "none_meet" and result.value is None
    assert result.evaluations["verdict"].tolist() == ["uncertain", "uncertain"]
    assert result.evaluations["replications"].tolist() == [4, 4]
    assert len(result.runs) == 8


def test_capacity_search_is_identical_serially_and_on_two_workers() -> None:
    options: dict[str, Any] = {
        "low": 0.5,
        "high": 12.0,
        "tolerance": 0.5,
        "targets": {"ttft_us_p90": 1_000_000, "e2e_latency_us_p50": 2_000_000},
        "replications": 3,
        "seed": 2,
    }
    serial = simsim.capacity_search(BASE, "workload.rate_per_s", workers=1, **options)
    pooled = simsim.capacity_search(BASE, "workload.rate_per_s", workers=2, **options)
    assert (pooled.value, pooled.interval, pooled.status) == (
        serial.value,
        serial.interval,
        serial.status,
    )
    assert serial.status == "found"
    pdt.assert_frame_equal(pooled.evaluations, serial.evaluations)
    pdt.assert_frame_equal(pooled.runs, serial.runs)


def test_capacity_search_with_an_extra_percentile_target() -> None:
    result = simsim.capacity_search(
        synthetic_model,
        "load",
        low=1.0,
        high=3.0,
        targets={"ttft_us_p95": 100_000, "tpot_us_p99.9": 100.0},
        replications=2,
        workers=1,
    )
    assert result.status == "all_meet"
    assert {"ttft_us_p95", "tpot_us_p99.9", "ttft_us_p99"} <= set(result.runs.columns)
    assert {"ttft_us_p95_mean", "tpot_us_p99.9_ci_high"} <= set(result.evaluations.columns)
    row = result.runs.to_dict("records")[0]
    expected = summarize(synthetic_model({"load": row["load"]}, row["seed"]), percentiles=[95]).loc[
        "ttft_us_p95", "value"
    ]
    assert row["ttft_us_p95"] == expected


def test_capacity_search_reuses_its_own_runs_in_an_out_folder(
    tmp_path: Path, calls: list[tuple[dict[str, Any], int]]
) -> None:
    options: dict[str, Any] = {
        "low": 1.0,
        "high": 9.0,
        "tolerance": 0.5,
        "targets": {"ttft_us_mean": 5_000},
        "replications": 2,
        "workers": 1,
        "out": tmp_path,
    }
    first = simsim.capacity_search(counting_model, "load", **options)
    assert len(calls) == len(first.runs) == len(list((tmp_path / "runs").glob("*.json")))
    calls.clear()
    second = simsim.capacity_search(counting_model, "load", **options)
    assert calls == []
    assert (second.value, second.interval) == (first.value, first.interval)
    pdt.assert_frame_equal(second.evaluations, first.evaluations)
    pdt.assert_frame_equal(second.runs, first.runs)


def test_capacity_search_reuses_a_sweeps_runs_in_the_same_folder(
    tmp_path: Path, calls: list[tuple[dict[str, Any], int]]
) -> None:
    swept = simsim.sweep(
        counting_model, {"load": [1.0, 9.0]}, replications=2, workers=1, out=tmp_path
    )
    calls.clear()
    result = simsim.capacity_search(
        counting_model,
        "load",
        low=1.0,
        high=9.0,
        targets={"ttft_us_mean": 50_000},
        replications=2,
        workers=1,
        out=tmp_path,
    )
    assert result.status == "all_meet"
    assert calls == []
    # Without settings a probed value's runs are the sweep's, seeds and all.
    keys = ["load", "replication"]
    columns = ["seed", *metric_names()]
    pdt.assert_frame_equal(
        result.runs.set_index(keys)[columns].sort_index(),
        swept.runs.set_index(keys)[columns].sort_index(),
    )


def test_capacity_search_settings_reach_a_model(
    calls: list[tuple[dict[str, Any], int]],
) -> None:
    simsim.capacity_search(
        counting_model,
        "load",
        low=1.0,
        high=9.0,
        targets={"ttft_us_mean": 50_000},
        settings={"spread": 1.0},
        replications=2,
        workers=1,
    )
    assert all(params.get("spread") == 1.0 for params, _ in calls)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ({}, "non-empty"),
        ({"ttft_p99": 1.0}, "unknown metric"),
        ({"ttft_us_max": 1.0}, "unknown metric"),
        ({"ttft_us_p100": 1.0}, "unknown metric"),
        ({"ttft_us_p0": 1.0}, "unknown metric"),
        ({"throughput_requests_per_s": 1.0}, "unknown metric"),
        ({"ttft_us_p95.0": 1.0}, "write the percentile"),
        ({"ttft_us_p99": math.inf}, "finite"),
        ({"ttft_us_p99": math.nan}, "finite"),
        ({"ttft_us_p99": True}, "finite"),
        ({"ttft_us_p99": "1000"}, "finite"),
    ],
)
def test_capacity_targets_are_checked_before_anything_runs(
    targets: dict[str, Any], message: str, calls: list[tuple[dict[str, Any], int]]
) -> None:
    with pytest.raises(ValueError, match=message):
        simsim.capacity_search(
            counting_model, "load", low=1.0, high=9.0, targets=targets, workers=1
        )
    assert calls == []


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"low": 5.0, "high": 5.0}, ValueError, "below"),
        ({"low": 6.0, "high": 5.0}, ValueError, "below"),
        ({"low": math.nan}, ValueError, "finite"),
        ({"high": "9"}, TypeError, "number"),
        ({"replications": 1}, ValueError, "at least 2"),
        ({"replications": 0}, ValueError, "replications"),
        ({"replications": 4, "max_replications": 3}, ValueError, "max_replications"),
        ({"max_replications": 10**7}, ValueError, "max_replications must be at most 1,000,000"),
        ({"find": "mid"}, ValueError, "find"),
        ({"tolerance": 0}, ValueError, "tolerance"),
        ({"tolerance": -0.5}, ValueError, "tolerance"),
        ({"confidence": 1.5}, ValueError, "confidence"),
        ({"workers": 0}, ValueError, "workers"),
        ({"executor": object(), "workers": None}, TypeError, "Executor"),
        ({"settings": {"load": 2.0}}, ValueError, "grid axis"),
        ({"settings": {"scenario.seed": 2}}, ScenarioError, "scenario.seed"),
    ],
)
def test_bad_capacity_arguments_are_refused_before_anything_runs(
    options: dict[str, Any],
    error: type[Exception],
    message: str,
    calls: list[tuple[dict[str, Any], int]],
) -> None:
    arguments: dict[str, Any] = {
        "low": 1.0,
        "high": 9.0,
        "targets": {"ttft_us_mean": 5_000},
        "workers": 1,
    }
    arguments.update(options)
    with pytest.raises(error, match=message):
        simsim.capacity_search(counting_model, "load", **arguments)
    assert calls == []


def test_capacity_search_with_an_unknown_scenario_parameter_names_it() -> None:
    progress: list[tuple[int, int]] = []
    with pytest.raises(ScenarioError, match=r"workload\.rate"):
        simsim.capacity_search(
            BASE,
            "workload.rate",
            low=1.0,
            high=4.0,
            targets={"ttft_us_p99": 1_000_000},
            workers=1,
            progress=record_progress(progress),
        )
    assert all(done == 0 for done, _ in progress)


# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize("df", [0.5, 1, 2, 3, 4.5, 9, 30, 120, 10_000, 100_000])
def test_student_t_quantile_matches_scipy(df: float) -> None:
    stats = pytest.importorskip("scipy.stats")
    for p in (1e-6, 0.001, 0.025, 0.05, 0.2, 0.5, 0.6, 0.9, 0.95, 0.975, 0.995, 0.9995):
        expected = stats.t.ppf(p, df)
        assert student_t_quantile(p, df) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_student_t_quantile_is_antisymmetric_and_checks_its_arguments() -> None:
    assert student_t_quantile(0.5, 3) == 0.0
    assert student_t_quantile(0.1, 7) == -student_t_quantile(0.9, 7)
    # Cauchy (df = 1) has a closed form: tan(pi * (p - 1/2)).
    assert student_t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-10)
    for p in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="p must be"):
            student_t_quantile(p, 3)
    for df in (0, -1):
        with pytest.raises(ValueError, match="degrees of freedom"):
            student_t_quantile(0.9, df)


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.95, 0.99])
@pytest.mark.parametrize("count", [2, 3, 5, 12])
def test_mean_interval_matches_scipy(confidence: float, count: int) -> None:
    stats = pytest.importorskip("scipy.stats")
    values = np.random.default_rng(count).normal(100.0, 15.0, size=count)
    interval = mean_interval(values, confidence)
    low, high = stats.t.interval(confidence, count - 1, loc=values.mean(), scale=stats.sem(values))
    assert interval.count == count
    assert interval.mean == pytest.approx(values.mean(), rel=1e-12)
    assert interval.std == pytest.approx(values.std(ddof=1), rel=1e-12)
    assert interval.low == pytest.approx(low, rel=1e-10)
    assert interval.high == pytest.approx(high, rel=1e-10)


def test_mean_interval_skips_nan_and_degenerates_gracefully() -> None:
    interval = mean_interval([2.0, math.nan, 4.0])
    assert (interval.mean, interval.count) == (3.0, 2)
    assert interval.std == pytest.approx(math.sqrt(2.0))
    single = mean_interval([math.nan, 5.0])
    assert (single.mean, single.count) == (5.0, 1)
    assert math.isnan(single.std) and math.isnan(single.low) and math.isnan(single.high)
    empty = mean_interval([math.nan])
    assert empty.count == 0 and math.isnan(empty.mean)
    constant = mean_interval([7.0, 7.0, 7.0])
    assert (constant.low, constant.mean, constant.high, constant.std) == (7.0, 7.0, 7.0, 0.0)
    for confidence in (0.0, 1.0):
        with pytest.raises(ValueError, match="confidence"):
            mean_interval([1.0, 2.0], confidence)


def test_percentile_labels_keep_every_digit() -> None:
    from simsim.results import percentile_label

    assert percentile_label(99) == "p99"
    assert percentile_label(99.9) == "p99.9"
    assert percentile_label(99.99999) == "p99.99999"
    frame = summarize(finished_requests(np.arange(1, 101, dtype=np.int64)), percentiles=[99.99999])
    assert "ttft_us_p99.99999" in frame.index


def test_mean_interval_is_clipped_to_its_bounds() -> None:
    values = [0.2, 0.9, 1.0]
    free = mean_interval(values)
    assert free.low < 0 and free.high > 1  # a symmetric t interval from 3 values
    clipped = mean_interval(values, bounds=(0.0, 1.0))
    assert (clipped.low, clipped.high) == (0.0, 1.0)
    assert (clipped.mean, clipped.std, clipped.count) == (free.mean, free.std, free.count)
    one_sided = mean_interval([1.0, 2.0, 30.0], bounds=(0.0, math.inf))
    assert one_sided.low == 0.0 and one_sided.high == mean_interval([1.0, 2.0, 30.0]).high
    assert math.isnan(mean_interval([5.0], bounds=(0.0, 1.0)).low)  # one value: no interval
    with pytest.raises(ValueError, match=r"bounds must be \(low, high\) with low <= high"):
        mean_interval(values, bounds=(1.0, 0.0))


def test_every_summarize_metric_has_a_range_and_fractions_end_at_1() -> None:
    metrics = metric_names(ttft_slo_us=1_000, tpot_slo_us=100.0, percentiles=[50, 99.9])
    ranges = {metric: metric_range(metric) for metric in metrics}
    assert ranges.pop("slo_attainment") == (0.0, 1.0)
    assert set(ranges.values()) == {(0.0, math.inf)}
    for fraction in ("slot_utilisation", "busy_fraction", "gpu_utilization"):
        assert metric_range(fraction) == (0.0, 1.0)
    for count in ("queue_length_mean", "count_FINISHED", "prompt_tokens_mean"):
        assert metric_range(count) == (0.0, math.inf)
    # A column of the caller's own, which may be negative, is never clipped.
    for unknown in ("profit", "status", "slack"):
        assert metric_range(unknown) == (-math.inf, math.inf)


def test_every_metric_summarize_reports_has_a_known_range() -> None:
    # A metric whose name says nothing of its range gets an unclipped interval (once, a
    # rejected_share below 0): every row summarize and class_summary give, for every kind
    # of scenario, must be a fraction or at least 0.
    from simsim.results import class_summary

    names: set[str] = set()
    for name, extra in [
        ("small.toml", ""),
        ("cluster.toml", ""),
        ("disaggregated.toml", ""),
        ("classes.toml", '[admission.limits."*"]\nrate_per_s = 1.0\nmax_queued = 2\n'),
        ("batching.toml", "[prefix_cache]\n"),
    ]:
        document = tomllib.loads((EXAMPLES / name).read_text(encoding="utf-8") + extra)
        server = run_scenario(parse_scenario(document, source=name, base_dir=EXAMPLES))
        frame = server.requests_frame()
        slots: Any = sum(r.max_active_requests for r in getattr(server, "replicas", [server]))
        if "prefill_replica" in frame:
            pools = (server.prefill_replicas, server.decode_replicas)  # type: ignore[union-attr]
            slots = tuple(sum(r.max_active_requests for r in pool) for pool in pools)
        names |= set(summarize(frame, slots=slots, ttft_slo_us=1e6, tpot_slo_us=1e5).index)
        if "tenant" in frame:
            names |= set(class_summary(frame, "tenant", slo={"*": {"ttft_us": 1e6}}).index)
    assert {"rejected_share", "decode_utilization", "replica_load_imbalance"} <= names
    unknown = sorted(name for name in names if metric_range(name)[0] == -math.inf)
    assert unknown == [], unknown
