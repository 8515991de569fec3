"""The vLLM reference cases: reading rows, the workload they describe, the runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simsim.cli import main
from simsim.gpu.reference import (
    INPUT_COLUMNS,
    METRICS,
    case_requests,
    case_scenario,
    error_summary,
    predict_cases,
    prediction_errors,
    read_cases,
    scenario_toml,
    simulate_case,
)

DATA = Path(__file__).parent / "data"
TRAIN = pd.read_csv(DATA / "vllm_train.csv")
ROOT = Path(__file__).parent.parent


def row(case_id: int) -> pd.DataFrame:
    return TRAIN[TRAIN["case_id"] == case_id]


def test_every_training_row_reads_as_a_case() -> None:
    cases = read_cases(TRAIN)
    assert len(cases) == 40
    assert len({case.experiment for case in cases}) == 16
    first = cases[0]
    assert (first.model, first.hardware, first.tp, first.dp) == (
        "meta-llama/Llama-2-7b-hf",
        "H100",
        1,
        1,
    )
    assert first.stage_rates_rps == (5.0, 10.0)
    assert first.gpu_mem_util == 0.9  # empty: vLLM's default
    assert first.precision is None  # FP16 native: the model's own


def test_only_input_columns_are_read() -> None:
    inputs = TRAIN[[c for c in INPUT_COLUMNS if c in TRAIN.columns]]
    assert read_cases(inputs) == read_cases(TRAIN)


def test_stage_windows_cover_the_run() -> None:
    cases = read_cases(row(154)) + read_cases(row(155)) + read_cases(row(156))
    assert [case.stage_window_us() for case in cases] == [
        (0, 1_200_000_000),
        (0, 600_000_000),
        (600_000_000, 1_200_000_000),
    ]


def test_requests_follow_the_stages_and_share_system_prompts() -> None:
    (case,) = read_cases(row(154))
    specs = case_requests(case)
    # 5/s for 600 s then 10/s for 600 s; inference-perf's random gaps fill each stage
    assert len(specs) == 3000 + 6000
    arrivals = [s.arrival_time_us for s in specs]
    assert arrivals[2999] == 600_000_000 and arrivals[-1] == 1_200_000_000
    assert arrivals == sorted(arrivals)
    assert {s.prompt_token_count for s in specs} == {566}
    assert {s.max_output_tokens for s in specs} == {247}
    assert [s.tags["stage"] for s in specs[2999:3001]] == [0, 1]
    # 11 system prompts x 4 users = 44 users taking turns; 100 system tokens = 6 blocks
    hashes = [s.block_hashes for s in specs[:44]]
    assert all(h is not None and len(h) == 566 // 16 for h in hashes)
    assert len({h for h in hashes}) == 44  # each user asks its own question
    assert len({h[:6] for h in hashes if h}) == 11  # behind one of 11 system prompts
    assert specs[44].block_hashes in hashes  # and asks it again on its next turn
    assert case_requests(case) == specs  # the same seed, the same requests


def test_bad_rows_are_named() -> None:
    bad = row(154).assign(all_stage_rates_rps="5;x")
    with pytest.raises(ValueError, match="case 154: all_stage_rates_rps"):
        read_cases(bad)
    with pytest.raises(ValueError, match="2 stage rates but 1 durations"):
        read_cases(row(154).assign(all_stage_durations_s="600"))
    with pytest.raises(ValueError, match="lack the input column"):
        read_cases(TRAIN.drop(columns=["output_len"]))


def test_errors_compare_by_case_id() -> None:
    predictions = pd.DataFrame(
        [
            {
                "case_id": "154",
                **{m: 2 * float(row(154)[m].iloc[0]) for m in METRICS},
                "overloaded": False,
            }
        ]
    )
    errors = prediction_errors(predictions, TRAIN)
    assert errors.loc[0, "e2e_mean_ms_error_pct"] == pytest.approx(100.0)
    summary = error_summary(errors)
    assert set(summary["median_ape_pct"].round(6)) == {100.0}


def test_runner_predicts_shortened_cases(tmp_path: Path) -> None:
    # Two experiments cut to a few seconds: a steady one and one far past capacity.
    steady = row(158).assign(all_stage_durations_s="8", stage_duration_s=8)
    flooded = row(160).assign(all_stage_rates_rps="40", all_stage_durations_s="20")
    cases = pd.concat([steady, flooded])[[c for c in INPUT_COLUMNS if c in TRAIN]]
    path = tmp_path / "cases.csv"
    cases.to_csv(path, index=False)
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/vllm_reference/run.py"),
            "--cases",
            str(path),
            "--out",
            str(tmp_path / "out"),
            "--scenarios",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    predictions = pd.read_csv(tmp_path / "out/predictions.csv")
    assert list(predictions.columns) == ["case_id", *METRICS, "overloaded"]
    assert predictions["overloaded"].tolist() == [False, True]
    assert (predictions[list(METRICS)] > 0).all().all()
    assert not (tmp_path / "out/errors.csv").exists()  # no measured columns given
    written = sorted(path.name for path in (tmp_path / "out/scenarios").iterdir())
    assert written == ["case_158.toml", "case_160.toml"]
    assert main(["validate", str(tmp_path / "out/scenarios/case_160.toml")]) == 0


def test_every_row_is_a_scenario_file_with_the_same_requests(tmp_path: Path) -> None:
    # A steady row, cut to 6 s so that the test stays quick.
    (case,) = read_cases(row(158).assign(all_stage_durations_s="6"))
    path = tmp_path / "case.toml"
    path.write_text(scenario_toml(case_scenario(case)))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    ran = pd.read_csv(tmp_path / "out/requests.csv")
    simulated = simulate_case(case)
    columns = ["request_id", "arrival_time_us", "prompt_token_count", "finish_time_us"]
    assert len(ran) == 36
    assert ran[columns].values.tolist() == simulated[columns].values.tolist()
    assert ran["client_e2e_us"].tolist() == pytest.approx(simulated["client_e2e_us"].tolist())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"output_len": "abc"}, "case 154: output_len must be a whole number, got 'abc'"),
        ({"tp": float("nan")}, "case 154: tp is empty; it must be a whole number"),
        ({"max_num_seqs": 2.5}, "case 154: max_num_seqs must be a whole number, got 2.5"),
        ({"model": "meta-llama/Llama-2-7b"}, "case 154: unknown model 'meta-llama/Llama-2-7b'"),
        ({"hardware": "H1000"}, r"case 154: unknown GPU 'H1000' \(did you mean 'H100-SXM'"),
        ({"tp": 3}, "case 154: tp=3 does not divide"),
        ({"gpu_mem_util": 1.5}, r"case 154: gpu_mem_util must be in \(0, 1\]"),
        ({"question_len": -5}, "case 154: "),
        ({"case_id": float("nan")}, "row 1 of the cases: case_id is empty"),
    ],
)
def test_a_bad_row_is_named_before_anything_runs(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_cases(row(154).assign(**change))


def runner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/vllm_reference/run.py"), *args],
        capture_output=True,
        text=True,
    )


def test_the_runner_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    cases = tmp_path / "cases.csv"
    row(154).assign(tp=3).to_csv(cases, index=False)
    done = runner("--cases", str(cases), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr == (
        f"run.py: error: --cases {cases}: case 154: tp=3 does not divide "
        "meta-llama/Llama-2-7b-hf's 32 attention heads\n"
    )
    missing = runner("--cases", str(tmp_path / "none.csv"), "--out", str(tmp_path / "out"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "none.csv" in missing.stderr
    typo = tmp_path / "coefficients.json"
    typo.write_text('{"memroy_scale": 1.1}')
    done = runner(
        "--cases", str(cases), "--out", str(tmp_path / "out"), "--coefficients", str(typo)
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "memroy_scale" in done.stderr


def test_runner_coefficients_may_name_only_some_fields(tmp_path: Path) -> None:
    cases = tmp_path / "cases.csv"
    row(158).assign(all_stage_durations_s="2", stage_duration_s=2).to_csv(cases, index=False)
    some = tmp_path / "coefficients.json"
    some.write_text('{"per_layer_us": 19.8}')
    done = runner(
        "--cases", str(cases), "--out", str(tmp_path / "out"), "--coefficients", str(some)
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out/predictions.csv").exists()


def test_a_server_that_does_not_fit_is_a_nan_row_not_a_stop(tmp_path: Path) -> None:
    # Llama-2-70B on one H100 does not fit; the steady row beside it is still predicted.
    fits = row(158).assign(all_stage_durations_s="2", stage_duration_s=2)
    too_big = fits.assign(case_id=999, model="meta-llama/Llama-2-70b-hf")
    cases = read_cases(pd.concat([fits, too_big]))
    reasons: list[str] = []
    predictions = predict_cases(cases, skipped=lambda case, why: reasons.append(why))
    assert predictions["case_id"].tolist() == ["158", "999"]
    assert predictions.loc[0, list(METRICS)].notna().all()
    assert predictions.loc[1, list(METRICS)].isna().all()
    assert not predictions.loc[1, "overloaded"]
    assert len(reasons) == 1 and "short by 57.7 GiB; try tp=2" in reasons[0]
    path = tmp_path / "cases.csv"
    pd.concat([fits, too_big]).to_csv(path, index=False)
    done = runner("--cases", str(path), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "run.py: case 999 not predicted: " in done.stderr
    assert len(pd.read_csv(tmp_path / "out/predictions.csv")) == 2
