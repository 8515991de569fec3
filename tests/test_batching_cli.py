"""Scenario files that choose the batching server, and what the command line writes for it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simsim.cli import main
from simsim.results import iterations_frame
from simsim.scenario import ScenarioError, load_scenario, run_scenario

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "batching.toml"

BATCHING = '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 4\n'
ONE_REQUEST = (
    "[[requests]]\nrequest_id = 0\narrival_time_us = 0\n"
    "prompt_token_count = 4\nmax_output_tokens = 2\n"
)


def test_batching_scenario_writes_iterations_and_plots_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    requests = pd.read_csv(tmp_path / "requests.csv")
    iterations = pd.read_csv(tmp_path / "iterations.csv")
    assert len(requests) == 500 and (requests["state"] == "FINISHED").all()
    assert list(iterations.columns) == list(iterations_frame([]).columns)
    # mixed policy: decode tokens plus prefill chunk never exceed the 512-token budget
    assert (iterations["prefill_tokens"] + iterations["decoding_count"] <= 512).all()
    assert (iterations["batch_size"] <= 16).all()
    assert (iterations["kv_blocks_in_use"] <= 400).all()
    generated = requests["generated_token_count"].sum()
    assert iterations["decoding_count"].sum() == generated
    capsys.readouterr()
    assert main(["plot", str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert written[-1] == str(tmp_path / "iterations.png")
    assert (tmp_path / "iterations.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batching_scenario_runs_the_batching_engine() -> None:
    scenario = load_scenario(EXAMPLE)
    assert scenario.engine == "batching" and scenario.batching is not None
    assert scenario.batching.policy == "mixed"
    engine = run_scenario(scenario)
    assert type(engine).__name__ == "BatchingEngine"
    assert len(engine.iterations_frame()) == len(engine.iteration_log) > 0


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        (
            '[scenario]\nengine = "single_slot"\n[batching]\nmax_active_requests = 2\n',
            "batching",
            'only for engine = "batching"',
        ),
        (
            '[scenario]\nengine = "batching"\n',
            "batching.max_active_requests",
            "missing required key",
        ),
        (
            BATCHING + 'policy = "mixed"\n',
            "batching",
            "needs max_batch_tokens",
        ),
        (
            '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 4\n'
            "max_batch_tokens = 2\n",
            "batching",
            "must be >= max_active_requests",
        ),
        (
            BATCHING + 'policy = "mix"\n',
            "batching.policy",
            "did you mean 'mixed'",
        ),
        (
            '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 4\n'
            "[kv_cache]\nblock_size_tokens = 0\ntotal_blocks = 4\n",
            "kv_cache.block_size_tokens",
            "must be >= 1, got 0",
        ),
        (
            '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 4\n'
            "[kv_cache]\nblock_size = 16\ntotal_blocks = 4\n",
            "kv_cache.block_size",
            "did you mean 'block_size_tokens'",
        ),
    ],
)
def test_bad_batching_settings_name_the_key(tmp_path: Path, text: str, key: str, rule: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + ONE_REQUEST)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert f"{path}: {key}: " in str(info.value)
    assert rule in str(info.value)


# A request of 100 prompt tokens needs 7 blocks of 16; the whole cache has 4.
NEVER_FITS = (
    BATCHING
    + "[backend]\nprefill_base_us = 100\ndecode_base_us = 10\n"
    + "[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 4\n"
    + ONE_REQUEST
    + "[[requests]]\nrequest_id = 7\narrival_time_us = 5\n"
    + "prompt_token_count = 100\nmax_output_tokens = 2\n"
)
NEVER_FITS_RULE = (
    "request 7: needs 7 KV blocks for its 100 prompt and 2 output tokens, more than the "
    "whole cache (4 blocks of 16 tokens); it could never run"
)


def test_validate_refuses_a_request_that_can_never_fit_the_kv_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(NEVER_FITS, encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"simsim: error: {path}: {NEVER_FITS_RULE}"]


def test_run_refuses_it_as_a_bad_file_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(NEVER_FITS, encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"simsim: error: {path}: {NEVER_FITS_RULE}"]
    with pytest.raises(ScenarioError) as info:
        run_scenario(load_scenario(path))
    assert info.value.key == "request 7"


def test_validate_accepts_the_same_request_when_the_cache_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(NEVER_FITS.replace("total_blocks = 4", "total_blocks = 7"), encoding="utf-8")
    assert main(["validate", str(path)]) == 0
    assert "2 requests" in capsys.readouterr().out


def test_a_second_run_into_the_same_folder_leaves_only_its_own_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = "[backend]\nprefill_base_us = 100\ndecode_base_us = 10\n"
    batching = tmp_path / "batching.toml"
    batching.write_text(BATCHING + backend + ONE_REQUEST)
    single = tmp_path / "single.toml"
    single.write_text(backend + ONE_REQUEST)
    out = tmp_path / "out"
    assert main(["run", str(batching), "--out", str(out), "--format", "parquet"]) == 0
    assert (out / "iterations.parquet").is_file()
    capsys.readouterr()
    assert main(["run", str(single), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err == f"simsim: replaced the tables of an earlier run in {out}/\n"
    assert sorted(path.name for path in out.iterdir()) == [
        "admissions.csv",
        "events.csv",
        "requests.csv",
        "run.json",
        "summary.csv",
    ]


def test_run_refuses_a_sweep_folder_and_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    (sweep / "summary.csv").write_text("point,metric\n")
    scenario = tmp_path / "single.toml"
    scenario.write_text("[backend]\nprefill_base_us = 100\n" + ONE_REQUEST)
    assert main(["run", str(scenario), "--out", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"simsim: error: --out: {sweep} holds a sweep (it has sweep.json); give another folder\n"
    )
    assert sorted(path.name for path in sweep.iterdir()) == ["summary.csv", "sweep.json"]
    assert (sweep / "summary.csv").read_text() == "point,metric\n"


def test_the_run_table_shows_batch_size_kv_memory_and_preemptions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    iterations = pd.read_csv(tmp_path / "iterations.csv")
    events = pd.read_csv(tmp_path / "events.csv")
    ran = iterations[~iterations["abandoned"]]
    weight = ran["end_us"] - ran["start_us"]
    batch = (ran["batch_size"] * weight).sum() / weight.sum()
    used = (ran["kv_blocks_in_use"] * weight).sum() / weight.sum() / 400
    peak = ran["kv_blocks_in_use"].max() / 400
    preemptions = (events["event_type"] == "REQUEST_PREEMPTED").sum()
    assert preemptions > 0  # the example's cache is small enough to preempt
    assert (
        f"batching      {len(iterations)} iterations, {batch:.2f} requests per batch on "
        f"average, {preemptions} preemptions"
    ) in lines
    assert (
        f"KV cache      {used:.1%} of 400 blocks in use on average, {peak:.1%} at the peak" in lines
    )
