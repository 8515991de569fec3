"""The committed llama.cpp recordings, replayed through simsim without building anything.

``benchmarks/fidelity/run.py`` measured llama.cpp's ``llama-server`` (one slot, and four
with ``--parallel 4``), fitted simsim to it with ``simsim calibrate`` and recorded every
workload twice; ``benchmarks/fidelity/results/`` keeps the probes, the fitted tables,
the measured requests tables and the comparisons. Here simsim predicts every workload
again from the committed table, and the errors must be the committed ones, within the
bounds ``docs/fidelity.md`` states ("The llama.cpp reference").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from simsim.fidelity.calibrate import fit_backend, measured_decode_observations, probes_frame
from simsim.fidelity.compare import compare_runs
from simsim.run_folder import read_run_folder
from simsim.scenario import load_backend, load_scenario, run_scenario

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "fidelity"
RESULTS = BENCH / "results"
CONFIGS = ("single_slot", "batching")
WORKLOADS = ("calib", "rate", "lengths", "bursty")
HELD_OUT = ("rate", "lengths", "bursty")
LATENCIES = ("ttft_us", "e2e_latency_us")
PERCENTILES = ("p50", "p90", "p99")

# The bounds docs/fidelity.md states for the held-out workloads, as fractions.
DOCUMENTED: dict[str, dict[str, float]] = {
    "single_slot": {"percentile": 0.11, "tpot_p50": 0.05, "median_ape": 0.07},
    "batching": {"percentile": 0.22, "tpot_p50": 0.16, "median_ape": 0.14},
}


def _committed(config: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(
        (RESULTS / config / "comparisons.json").read_text(encoding="utf-8")
    )
    return records


def _record(config: str, workload: str, kind: str) -> dict[str, Any]:
    (found,) = [
        r for r in _committed(config) if r["workload"] == workload and r["comparison"] == kind
    ]
    return found


def _predicted(config: str, workload: str) -> pd.DataFrame:
    scenario = load_scenario(
        BENCH / "workloads" / config / f"{workload}.toml",
        backend=RESULTS / config / "backend.toml",
    )
    return run_scenario(scenario).requests_frame()


@pytest.mark.parametrize("config", CONFIGS)
def test_the_committed_recordings_fit_the_committed_backends(config: str) -> None:
    """Probes alone give backend-probes.toml; with the calibration workload's own decode
    steps (its run 1's token gaps) they give backend.toml, the one the predictions use."""
    probes = probes_frame(pd.read_csv(RESULTS / config / "probes.csv", keep_default_na=False))
    assert fit_backend(probes, config).config == load_backend(
        RESULTS / config / "backend-probes.toml"
    )
    calib = read_run_folder(RESULTS / config / "measured" / "calib-run1")
    decode = measured_decode_observations(calib.requests(), calib.table("tokens"))
    fitted = fit_backend(probes, config, decode=decode)
    assert fitted.config == load_backend(RESULTS / config / "backend.toml")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_simsim_predicts_the_recording_with_the_committed_errors(
    config: str, workload: str
) -> None:
    measured = read_run_folder(RESULTS / config / "measured" / f"{workload}-run1")
    assert measured.measured
    comparison = compare_runs(measured, _predicted(config, workload))
    record = _record(config, workload, "simulated")
    committed = {(row["metric"], row["percentile"]): row for row in record["percentiles"]}
    for row in comparison.percentiles.itertuples():
        expected = committed[(row.metric, row.percentile)]
        assert row.a_us == pytest.approx(expected["a_us"])
        assert row.b_us == pytest.approx(expected["b_us"])
    errors = {row["metric"]: row for row in record["errors"]}
    for metric, row in comparison.errors.iterrows():
        assert row["median_ape"] == pytest.approx(errors[metric]["median_ape"])
        assert row["used"] == errors[metric]["used"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("workload", HELD_OUT)
def test_held_out_errors_are_within_the_documented_bounds(config: str, workload: str) -> None:
    bounds = DOCUMENTED[config]
    record = _record(config, workload, "simulated")
    signed = {(r["metric"], r["percentile"]): r["signed_error"] for r in record["percentiles"]}
    for metric in LATENCIES:
        for percentile in PERCENTILES:
            assert abs(signed[(metric, percentile)]) <= bounds["percentile"], (metric, percentile)
    assert abs(signed[("tpot_us", "p50")]) <= bounds["tpot_p50"]
    errors = {r["metric"]: r for r in record["errors"]}
    assert errors["e2e_latency_us"]["median_ape"] <= bounds["median_ape"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_noise_floor_is_the_two_recordings_compared(config: str, workload: str) -> None:
    first = RESULTS / config / "measured" / f"{workload}-run1"
    second = RESULTS / config / "measured" / f"{workload}-run2"
    comparison = compare_runs(first, second)
    record = _record(config, workload, "noise")
    committed = {(r["metric"], r["percentile"]): r["signed_error"] for r in record["percentiles"]}
    for row in comparison.percentiles.itertuples():
        assert row.signed_error == pytest.approx(committed[(row.metric, row.percentile)])
    # Every request was measured in full on both runs: exact lengths held.
    for folder in (first, second):
        requests = read_run_folder(folder).requests()
        assert (requests["state"] == "FINISHED").all()
        assert (requests["generated_token_count"] == requests["max_output_tokens"]).all()
        assert (requests["usage_prompt_tokens"] == requests["prompt_token_count"]).all()


# docs/fidelity.md, "Against the target": held-out percentiles (TTFT and E2E, p50, p90,
# p99) within that workload's run-to-run difference, and medians within 5%.
AGAINST_THE_TARGET = {"single_slot": (11, 3), "batching": (8, 1)}


@pytest.mark.parametrize("config", CONFIGS)
def test_the_documented_count_against_the_target(config: str) -> None:
    within_noise = medians_within_5 = 0
    for workload in HELD_OUT:
        predicted = _record(config, workload, "simulated")["percentiles"]
        noise = _record(config, workload, "noise")["percentiles"]
        floor = {(r["metric"], r["percentile"]): abs(r["signed_error"]) for r in noise}
        for row in predicted:
            key = (row["metric"], row["percentile"])
            if row["metric"] not in LATENCIES:
                continue
            within_noise += abs(row["signed_error"]) <= floor[key]
            medians_within_5 += row["percentile"] == "p50" and abs(row["signed_error"]) <= 0.05
    assert (within_noise, medians_within_5) == AGAINST_THE_TARGET[config]
