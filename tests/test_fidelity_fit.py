"""Fitting: exact non-negative least squares, and calibration on probes with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from helpers import simulated_probes
from hypothesis import given, settings
from hypothesis import strategies as st

from simsim import FittedBackendConfig
from simsim.fidelity.calibrate import (
    backend_toml,
    decode_observations,
    fit_backend,
    prefill_observations,
    prefill_target_us,
    probe_plan,
    probes_frame,
)
from simsim.fidelity.fit import MAX_COLUMNS, fit_nonnegative, nnls
from simsim.scenario import parse_scenario

# ---------------------------------------------------------------------- nnls


def test_nnls_recovers_an_exact_non_negative_solution() -> None:
    rng = np.random.default_rng(1)
    matrix = rng.uniform(0, 10, size=(30, 4))
    truth = np.array([3.0, 0.0, 0.25, 7.5])
    assert np.allclose(nnls(matrix, matrix @ truth), truth)


def test_nnls_clamps_a_coefficient_that_wants_to_be_negative() -> None:
    # y = 10 - x: the best non-negative slope is 0, and the intercept the mean.
    x = np.arange(10.0)
    matrix = np.column_stack([np.ones(10), x])
    solution = nnls(matrix, 10 - x)
    assert solution[1] == 0.0
    assert solution[0] == pytest.approx(np.mean(10 - x))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(3, 12),
    columns=st.integers(1, 4),
)
def test_nnls_is_the_best_over_every_non_negative_corner(
    seed: int, rows: int, columns: int
) -> None:
    """No non-negative point on a grid around the answer does better (it is optimal)."""
    rng = np.random.default_rng(seed)
    matrix = rng.normal(size=(rows, columns))
    target = rng.normal(size=rows)
    solution = nnls(matrix, target)
    assert (solution >= 0).all()
    best = float(np.sum((matrix @ solution - target) ** 2))
    for step in itertools.product((-0.05, 0.0, 0.05), repeat=columns):
        other = np.maximum(solution + np.array(step), 0.0)
        assert float(np.sum((matrix @ other - target) ** 2)) >= best - 1e-9


@pytest.mark.parametrize(
    ("matrix", "target", "message"),
    [
        (np.ones((3, 2)), np.ones(4), "do not match"),
        (np.ones((0, 2)), np.ones(0), "no observations"),
        (np.ones((3, MAX_COLUMNS + 1)), np.ones(3), "at most"),
        (np.array([[1.0], [np.nan]]), np.ones(2), "non-finite"),
    ],
)
def test_nnls_refuses_bad_input(matrix: np.ndarray, target: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nnls(matrix, target)


def test_a_linear_fit_reports_r_squared_and_residuals() -> None:
    fit = fit_nonnegative({"base": [1, 1, 1, 1], "slope": [0, 1, 2, 3]}, [1, 3, 5, 8])
    assert fit.coefficient("slope") == pytest.approx(2.3)
    assert fit.r_squared == pytest.approx(1 - sum(r * r for r in fit.residuals) / 26.75)
    assert fit.predict({"base": 1, "slope": 10}) == pytest.approx(
        fit.coefficient("base") + 10 * fit.coefficient("slope")
    )
    perfect = fit_nonnegative({"base": [1, 1]}, [4, 4])
    assert perfect.r_squared == 1.0


# ---------------------------------------------------------------------- probes from simsim


TRUTH = FittedBackendConfig(
    prefill_base_us=11_500.0,
    prefill_per_token_us=920.0,
    prefill_per_token_squared_us=0.25,
    decode_base_us=9_000.0,
    decode_per_context_token_us=4.0,
)


def test_calibration_recovers_a_single_slot_model_through_the_first_token_mapping() -> None:
    plan = probe_plan(prompts=[16, 128, 512, 1024], outputs=[33], repeats=1)
    calibration = fit_backend(simulated_probes(plan, TRUTH, "single_slot"), "single_slot")
    fitted = calibration.config.as_dict()
    for name, value in TRUTH.as_dict().items():
        # Whole-microsecond rounding of each step is the only error.
        assert fitted[name] == pytest.approx(value, rel=0.01, abs=2.0), name
    assert calibration.decode_fit.r_squared > 0.999
    assert calibration.prefill_fit.r_squared > 0.999
    assert calibration.probe_summary["ttft_residual"].abs().max() < 0.001


def test_calibration_recovers_batch_and_context_terms_of_a_batching_model() -> None:
    truth = FittedBackendConfig(
        prefill_base_us=5_000.0,
        prefill_per_token_us=300.0,
        prefill_per_token_squared_us=0.1,
        prefill_per_sequence_us=2_000.0,
        decode_base_us=8_000.0,
        decode_per_sequence_us=3_000.0,
        decode_per_context_token_us=2.0,
    )
    plan = probe_plan(prompts=[32, 256, 1024], outputs=[41], concurrency=[1, 2, 4], repeats=1)
    calibration = fit_backend(simulated_probes(plan, truth, "batching"), "batching")
    fitted = calibration.config.as_dict()
    for name, value in truth.as_dict().items():
        assert fitted[name] == pytest.approx(value, rel=0.02, abs=5.0), name


def test_the_fitted_model_reproduces_the_probes_it_was_fitted_on() -> None:
    plan = probe_plan(prompts=[64, 700], outputs=[20], repeats=1)
    probes = simulated_probes(plan, TRUTH, "single_slot")
    refitted = simulated_probes(plan, fit_backend(probes, "single_slot").config, "single_slot")
    for before, after in zip(probes["token_times_us"], refitted["token_times_us"], strict=True):
        old = np.array(before.split(), dtype=float)
        new = np.array(after.split(), dtype=float)
        assert np.allclose(old, new, rtol=0.002, atol=50)


def test_the_mapping_takes_one_decode_step_off_the_measured_ttft() -> None:
    assert prefill_target_us(25_000.0, 9_000.0) == 16_000.0


def test_decode_observations_use_only_the_steady_window_of_a_burst() -> None:
    probes = probes_frame(
        [
            # Two requests sent together: request 1's first token comes at 300, request
            # 0's last at 900; only gaps inside [300, 900] count.
            _row(0, 0, "100 200 300 400 500 600 700 800 900"),
            _row(0, 1, "300 400 500 600 700 800 900 1000 1100"),
        ]
    )
    observations = decode_observations(probes, window=2)
    assert observations["gap_us"].tolist() == [100.0] * 6
    assert set(observations["concurrency"]) == {2}
    # Request 0's gaps 3..8 end tokens 4..9 over prompt (10) + 3..8.
    assert observations["context_sum"].iloc[0] == 2 * (10 + 3.5)
    ttft = prefill_observations(probes)
    assert ttft["ttft_us"].tolist() == [300.0]


def _row(probe: int, member: int, times: str, error: str = "") -> dict[str, object]:
    return {
        "probe": probe,
        "prompt_tokens": 10,
        "output_tokens": 9,
        "concurrency": 2,
        "repeat": 0,
        "member": member,
        "sent_us": 0,
        "token_times_us": times,
        "generated_tokens": len(times.split()),
        "error": error,
    }


def test_failed_probes_are_left_out_of_both_fits() -> None:
    probes = probes_frame([_row(0, 0, "100 200 300", error="HTTP 500"), _row(0, 1, "100 200 300")])
    assert decode_observations(probes).empty
    assert prefill_observations(probes).empty
    with pytest.raises(ValueError, match="0 decode observations: 1 of 2 probe requests failed"):
        fit_backend(probes, "batching")


def test_probe_plans_interleave_repeats_and_refuse_bad_sizes() -> None:
    plan = probe_plan(prompts=[8, 4], outputs=[16], concurrency=[2, 1], repeats=2)
    assert [(p.concurrency, p.prompt_tokens, p.repeat) for p in plan] == [
        (1, 4, 0),
        (1, 8, 0),
        (2, 4, 0),
        (2, 8, 0),
        (1, 4, 1),
        (1, 8, 1),
        (2, 4, 1),
        (2, 8, 1),
    ]
    assert [p.probe for p in plan] == list(range(8))
    with pytest.raises(ValueError, match="outputs must be integers >= 2"):
        probe_plan(prompts=[8], outputs=[1])
    with pytest.raises(ValueError, match="repeats"):
        probe_plan(prompts=[8], outputs=[8], repeats=0)
    with pytest.raises(ValueError, match="missing"):
        probes_frame(pd.DataFrame({"probe": [0]}))


def test_the_written_table_is_a_scenario_backend_as_it_is() -> None:
    plan = probe_plan(prompts=[16, 128, 512], outputs=[33], repeats=1)
    calibration = fit_backend(simulated_probes(plan, TRUTH, "single_slot"), "single_slot")
    text = backend_toml(calibration, url="http://127.0.0.1:1", model="m")
    assert text.startswith("# Fitted by simsim calibrate against http://127.0.0.1:1 (model m)")
    import tomllib

    document = tomllib.loads(text)
    document["requests"] = [
        {"request_id": 0, "arrival_time_us": 0, "prompt_token_count": 5, "max_output_tokens": 2}
    ]
    scenario = parse_scenario(document, require_backend=True)
    assert scenario.backend == calibration.config
    assert "R^2" in calibration.report()


def test_measured_decode_observations_keep_only_pure_decode_gaps() -> None:
    """Request 0 decodes alone, then with request 1, then alone again; gaps while 1
    waits for its first token (sent at 250, first token at 600) are left out."""
    requests = pd.DataFrame(
        {
            "request_id": [0, 1],
            "arrival_time_us": [0, 250],
            "prompt_token_count": [10, 20],
            "finish_time_us": [1000, 1000],
        }
    )
    tokens = pd.DataFrame(
        {
            "request_id": [0] * 7 + [1] * 3,
            "token_index": [*range(1, 8), *range(1, 4)],
            # Request 0: 100 alone, two gaps during 1's wait, 150 together with 1
            # (which ends at 900), then 100 alone.
            "time_us": [100, 200, 300, 600, 750, 900, 1000, 600, 750, 900],
        }
    )
    observations = decode_observations_of(requests, tokens)
    alone = observations[observations["concurrency"] == 1]
    together = observations[observations["concurrency"] == 2]
    # Alone: 100..200 (context 10 + 1 token) and 900..1000 (10 + 6), one context bin.
    assert alone["gap_us"].tolist() == [100.0]
    assert alone["context_sum"].tolist() == [13.5]
    # Together: 600..750 and 750..900 of each; contexts (10 + 4) + (20 + 1), then + 2.
    assert together["gap_us"].tolist() == [150.0]
    assert together["context_sum"].tolist() == [36.0]
    assert (together["probe"] == -1).all()


def decode_observations_of(requests: pd.DataFrame, tokens: pd.DataFrame) -> pd.DataFrame:
    from simsim.fidelity.calibrate import measured_decode_observations

    return measured_decode_observations(requests, tokens)


def test_a_decode_table_replaces_the_probes_decode_fit() -> None:
    plan = probe_plan(prompts=[16, 128, 512], outputs=[33], repeats=1)
    probes = simulated_probes(plan, TRUTH, "single_slot")
    decode = pd.DataFrame(
        {
            "probe": -1,
            "concurrency": [1, 1, 1],
            "context_sum": [100.0, 600.0, 1100.0],
            "gap_us": [2_000.0, 3_000.0, 4_000.0],
        }
    )
    calibration = fit_backend(probes, "single_slot", decode=decode)
    assert calibration.config.decode_base_us == pytest.approx(1_800.0)
    assert calibration.config.decode_per_context_token_us == pytest.approx(2.0)
    # The probes' own gaps still show in the summary, against the new model.
    assert calibration.probe_summary["gap_ms"].notna().all()
