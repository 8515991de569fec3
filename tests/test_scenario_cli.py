"""Scenario files (``simsim.scenario``) and the ``simsim`` command line.

Bad files: every error names the file, the key and the rule, and the CLI exits with 2
without running anything. Good files: inline requests, CSV traces relative to the
scenario file, seeded workloads and cancellations, checked on hand-worked numbers.
End to end: the installed console script and ``python -m simsim.cli`` write
``requests``, ``events``, ``admissions`` and ``summary`` tables that agree with each
other, in CSV and in Parquet.

Hand-worked costs: prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simsim
from simsim.cli import main
from simsim.results import OVERLOAD_METRICS
from simsim.scenario import (
    RequestSpec,
    ScenarioError,
    load_scenario,
    read_trace_csv,
    run_scenario,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "scenarios" / "small.toml"

EASY_BACKEND = """
[backend]
prefill_base_us = 100
prefill_per_token_us = 2
prefill_per_active_sequence_us = 0
decode_base_us = 10
decode_per_active_sequence_us = 0
"""

TRACE_HEADER = "request_id,arrival_time_us,prompt_token_count,max_output_tokens\n"

METRICS = [
    "requests",
    *(f"count_{state.name}" for state in simsim.RequestState),
    "makespan_us",
    "throughput_requests_per_s",
    "throughput_tokens_per_s",
    *(
        f"{column}_{stat}"
        for column in ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us")
        for stat in ("mean", "p50", "p90", "p99")
    ),
    "mean_queue_length",
    "mean_active_requests",
    "utilization",
    *OVERLOAD_METRICS,
]


def request(rid: int, arrival: object = 0, prompt: object = 1, out: object = 1) -> str:
    return (
        f"\n[[requests]]\nrequest_id = {rid}\narrival_time_us = {arrival}\n"
        f"prompt_token_count = {prompt}\nmax_output_tokens = {out}\n"
    )


def cancellation(time_us: object, rid: object) -> str:
    return f"\n[[cancellations]]\ntime_us = {time_us}\nrequest_id = {rid}\n"


WORKLOAD = """
[workload]
count = 3
rate_per_s = 100.0
prompt_tokens = [1, 8]
output_tokens = [1, 4]
first_request_id = 100
"""

ONE = request(0)


def write(directory: Path, text: str, name: str = "scenario.toml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def load_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return str(info.value)


# ============================================================== bad scenario files

# (file text, key at fault, words of the rule)
BAD_SCENARIOS = [
    # ---- missing required keys
    pytest.param(
        "[[requests]]\nrequest_id = 0\narrival_time_us = 0\nprompt_token_count = 5\n",
        "requests[0].max_output_tokens",
        "missing required key",
        id="missing-max_output_tokens",
    ),
    pytest.param(
        ONE
        + "\n[[requests]]\narrival_time_us = 0\nprompt_token_count = 5\nmax_output_tokens = 1\n",
        "requests[1].request_id",
        "missing required key",
        id="missing-request_id-second-table",
    ),
    pytest.param("[trace]\n", "trace.path", "missing required key", id="missing-trace-path"),
    pytest.param(
        "[workload]\nrate_per_s = 1.0\nprompt_tokens = [1, 2]\noutput_tokens = [1, 2]\n",
        "workload.count",
        "missing required key",
        id="missing-workload-count",
    ),
    pytest.param(
        "[workload]\ncount = 2\nprompt_tokens = [1, 2]\noutput_tokens = [1, 2]\n",
        "workload.arrivals",
        "missing required key (or give rate_per_s)",
        id="missing-workload-rate",
    ),
    pytest.param(
        ONE + "\n[[cancellations]]\nrequest_id = 0\n",
        "cancellations[0].time_us",
        "missing required key",
        id="missing-cancellation-time",
    ),
    pytest.param(
        ONE + "\n[[cancellations]]\ntime_us = 5\n",
        "cancellations[0].request_id",
        "missing required key",
        id="missing-cancellation-request",
    ),
    # ---- wrong types
    pytest.param(
        request(0, prompt='"128"'),
        "requests[0].prompt_token_count",
        "must be an integer, got string '128'",
        id="string-prompt",
    ),
    pytest.param(
        request(0, out="true"),
        "requests[0].max_output_tokens",
        "must be an integer, got boolean True",
        id="boolean-output",
    ),
    pytest.param(
        request(0, arrival='"0"'),
        "requests[0].arrival_time_us",
        "must be an integer number of microseconds, got string '0'",
        id="string-arrival",
    ),
    pytest.param(
        '[backend]\ndecode_base_us = "10"\n' + ONE,
        "backend.decode_base_us",
        "must be an integer, got string '10'",
        id="string-backend-cost",
    ),
    pytest.param(
        '[scenario]\nseed = "abc"\n' + ONE,
        "scenario.seed",
        "must be an integer, got string 'abc'",
        id="string-seed",
    ),
    pytest.param(
        "[scenario]\nname = 3\n" + ONE,
        "scenario.name",
        "must be a string, got integer 3",
        id="integer-name",
    ),
    pytest.param("[trace]\npath = 5\n", "trace.path", "must be a string", id="integer-path"),
    pytest.param(
        WORKLOAD.replace("rate_per_s = 100.0", 'rate_per_s = "fast"'),
        "workload.rate_per_s",
        "must be a number, got string 'fast'",
        id="string-rate",
    ),
    pytest.param(
        WORKLOAD.replace("rate_per_s = 100.0", "rate_per_s = true"),
        "workload.rate_per_s",
        "must be a number, got boolean True",
        id="boolean-rate",
    ),
    pytest.param(
        WORKLOAD.replace("prompt_tokens = [1, 8]", 'prompt_tokens = "16"'),
        "workload.prompt_tokens",
        "must be a table, got string",
        id="scalar-token-range",
    ),
    pytest.param(
        WORKLOAD.replace("prompt_tokens = [1, 8]", "prompt_tokens = [1, 2, 3]"),
        "workload.prompt_tokens",
        "must be a [min, max] pair of integers",
        id="triple-token-range",
    ),
    pytest.param(
        WORKLOAD.replace("output_tokens = [1, 4]", 'output_tokens = ["a", 4]'),
        "workload.output_tokens",
        "must be an integer, got string 'a'",
        id="string-in-token-range",
    ),
    pytest.param(
        "scenario = 5\n" + ONE, "scenario", "must be a table, got integer", id="scalar-table"
    ),
    pytest.param(
        "[requests]\nrequest_id = 0\n",
        "requests",
        "must be an array of tables ([[requests]]), got table",
        id="requests-as-table",
    ),
    pytest.param(
        "requests = [1, 2]\n", "requests[0]", "must be a table, got integer", id="requests-of-ints"
    ),
    pytest.param(
        '[[trace]]\npath = "t.csv"\n', "trace", "must be a table, got array", id="trace-as-array"
    ),
    pytest.param(
        "cancellations = 5\n" + ONE,
        "cancellations",
        "must be an array of tables ([[cancellations]]), got integer",
        id="cancellations-scalar",
    ),
    # ---- negative values
    pytest.param(
        request(0, arrival=-5),
        "requests[0].arrival_time_us",
        "must be >= 0 microseconds, got -5",
        id="negative-arrival",
    ),
    pytest.param(
        request(-1), "requests[0].request_id", "must be >= 0, got -1", id="negative-request-id"
    ),
    pytest.param(
        request(0, prompt=-3),
        "requests[0].prompt_token_count",
        "must be >= 0, got -3",
        id="negative-prompt",
    ),
    pytest.param(
        ONE + cancellation(-1, 0),
        "cancellations[0].time_us",
        "must be >= 0 microseconds, got -1",
        id="negative-cancellation-time",
    ),
    pytest.param(
        WORKLOAD + "start_time_us = -10\n",
        "workload.start_time_us",
        "must be >= 0 microseconds, got -10",
        id="negative-start-time",
    ),
    pytest.param(
        "[backend]\nprefill_base_us = -1\n" + ONE,
        "backend.prefill_base_us",
        "must be >= 0, got -1",
        id="negative-backend-cost",
    ),
    pytest.param(
        WORKLOAD.replace("count = 3", "count = -1"),
        "workload.count",
        "must be >= 1, got -1",
        id="negative-count",
    ),
    pytest.param(
        WORKLOAD.replace("rate_per_s = 100.0", "rate_per_s = 0"),
        "workload.rate_per_s",
        "must be a finite number > 0",
        id="zero-rate",
    ),
    pytest.param(
        WORKLOAD.replace("rate_per_s = 100.0", "rate_per_s = -2.5"),
        "workload.rate_per_s",
        "must be a finite number > 0, got -2.5",
        id="negative-rate",
    ),
    pytest.param(
        WORKLOAD.replace("prompt_tokens = [1, 8]", "prompt_tokens = [512, 16]"),
        "workload.prompt_tokens",
        "min 512 is greater than max 16",
        id="inverted-range",
    ),
    pytest.param(
        request(0, arrival=2**63),
        "requests[0].arrival_time_us",
        "must be at most 2**63 - 1, got 9223372036854775808",
        id="arrival-past-64-bits",
    ),
    # ---- float times and counts
    pytest.param(
        request(0, arrival=1.5),
        "requests[0].arrival_time_us",
        "must be an integer number of microseconds, got float 1.5",
        id="float-arrival",
    ),
    pytest.param(
        request(0, arrival="1.0"),
        "requests[0].arrival_time_us",
        "must be an integer number of microseconds, got float 1.0",
        id="integral-float-arrival",
    ),
    pytest.param(
        request(0, arrival="1e3"),
        "requests[0].arrival_time_us",
        "must be an integer number of microseconds, got float 1000.0",
        id="exponent-arrival",
    ),
    pytest.param(
        ONE + cancellation(2.5, 0),
        "cancellations[0].time_us",
        "must be an integer number of microseconds, got float 2.5",
        id="float-cancellation-time",
    ),
    pytest.param(
        WORKLOAD + "start_time_us = 0.5\n",
        "workload.start_time_us",
        "must be an integer number of microseconds, got float 0.5",
        id="float-start-time",
    ),
    pytest.param(
        "[backend]\ndecode_base_us = 10.0\n" + ONE,
        "backend.decode_base_us",
        "must be an integer, got float 10.0",
        id="float-backend-cost",
    ),
    pytest.param(
        request(0, out="3.0"),
        "requests[0].max_output_tokens",
        "must be an integer, got float 3.0 (write 3: whole numbers are TOML integers)",
        id="float-output",
    ),
    pytest.param(
        request(0, prompt="2e3"),
        "requests[0].prompt_token_count",
        "must be an integer, got float 2000.0 (write 2_000: whole numbers are TOML integers)",
        id="whole-float-count-names-its-spelling",
    ),
    pytest.param(
        request(0, arrival="1e6"),
        "requests[0].arrival_time_us",
        "must be an integer number of microseconds, got float 1000000.0 (write 1_000_000: "
        "whole numbers are TOML integers)",
        id="whole-float-time-names-its-spelling",
    ),
    pytest.param(
        request(0, prompt="1e300"),
        "requests[0].prompt_token_count",
        "must be an integer, got float 1e+300",  # no spelling: a float that large is inexact
        id="huge-float-count",
    ),
    pytest.param(
        '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = -3\n'
        + EASY_BACKEND
        + ONE,
        "batching.max_active_requests",
        "must be >= 1, got -3",  # the rule 0 breaks too, not ">= 0"
        id="negative-slots-say-the-rule-enforced",
    ),
    pytest.param(
        '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 4\n'
        "[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 0\n" + EASY_BACKEND + ONE,
        "kv_cache.total_blocks",
        "must be >= 1, got 0",
        id="zero-blocks-named-at-their-key",
    ),
    # ---- unknown keys, with a suggestion when one is close
    pytest.param(
        "[backend]\nprefil_base_us = 100\n" + ONE,
        "backend.prefil_base_us",
        "unknown key (did you mean 'prefill_base_us'?)",
        id="typo-backend-key",
    ),
    pytest.param(
        "[[requests]]\nrequest_id = 0\narival_time_us = 0\n"
        "prompt_token_count = 1\nmax_output_tokens = 1\n",
        "requests[0].arival_time_us",
        "unknown key (did you mean 'arrival_time_us'?)",
        id="typo-request-key",
    ),
    pytest.param(
        "[scenario]\nsede = 1\n" + ONE,
        "scenario.sede",
        "unknown key (did you mean 'seed'?)",
        id="typo-scenario-key",
    ),
    pytest.param(
        '[scheduler]\npolcy = "fcfs"\n' + ONE,
        "scheduler.polcy",
        "unknown key (did you mean 'policy'?)",
        id="typo-scheduler-key",
    ),
    pytest.param(
        '[trace]\npaht = "t.csv"\n',
        "trace.paht",
        "unknown key (did you mean 'path'?)",
        id="typo-trace-key",
    ),
    pytest.param(
        WORKLOAD.replace("rate_per_s", "rate_per_sec"),
        "workload.rate_per_sec",
        "unknown key (did you mean 'rate_per_s'?)",
        id="typo-workload-key",
    ),
    pytest.param(
        ONE + "\n[[cancellations]]\ntime = 5\nrequest_id = 0\n",
        "cancellations[0].time",
        "unknown key (did you mean 'time_us'?)",
        id="typo-cancellation-key",
    ),
    pytest.param(
        "[backend]\nprefill_base_us = 1\nbatch_size = 8\n" + ONE,
        "backend.batch_size",
        "unknown key; allowed keys: prefill_base_us, prefill_per_token_us",
        id="unknown-backend-key-no-suggestion",
    ),
    # ---- unknown top-level tables
    pytest.param(
        "[backnd]\nprefill_base_us = 1\n" + ONE,
        "backnd",
        "unknown key (did you mean 'backend'?)",
        id="typo-top-level-table",
    ),
    pytest.param(
        ONE + "\n[[cancelations]]\ntime_us = 1\nrequest_id = 0\n",
        "cancelations",
        "unknown key (did you mean 'cancellations'?)",
        id="typo-top-level-array",
    ),
    pytest.param(
        "[plotting]\ndpi = 100\n" + ONE,
        "plotting",
        "unknown key; allowed keys: scenario, backend, scheduler, batching, kv_cache, requests, "
        "trace, workload, cancellations",
        id="unknown-top-level-table",
    ),
    # ---- unknown values
    pytest.param(
        '[scheduler]\npolicy = "fcfz"\n' + ONE,
        "scheduler.policy",
        "unknown value 'fcfz' (did you mean 'fcfs'?)",
        id="typo-policy",
    ),
    pytest.param(
        '[scenario]\nengine = "continuous"\n' + ONE,
        "scenario.engine",
        "unknown value 'continuous'",
        id="unknown-engine",
    ),
    # ---- duplicate request ids
    pytest.param(
        request(7) + request(3) + request(7, arrival=5),
        "requests",
        "request id 7 appears twice (ids must be unique across",
        id="duplicate-inline-ids",
    ),
    pytest.param(
        request(101) + WORKLOAD,
        "requests",
        "request id 101 appears twice (ids must be unique across",
        id="duplicate-inline-and-workload",
    ),
    # ---- cancellations of unknown requests
    pytest.param(
        ONE + cancellation(5, 99),
        "cancellations[0].request_id",
        "request 99 is not in the scenario's requests",
        id="cancel-unknown-request",
    ),
    pytest.param(
        ONE + cancellation(5, 0) + cancellation(9, 42),
        "cancellations[1].request_id",
        "request 42 is not in the scenario's requests",
        id="cancel-unknown-request-second",
    ),
]


@pytest.mark.parametrize(("text", "key", "rule"), BAD_SCENARIOS)
def test_load_scenario_names_file_key_and_rule(
    tmp_path: Path, text: str, key: str, rule: str
) -> None:
    path = write(tmp_path, text, "bad.toml")
    message = load_error(path)
    assert f"{path}: {key}: " in message, message
    assert rule in message, message


@pytest.mark.parametrize(("text", "key", "rule"), BAD_SCENARIOS)
def test_cli_validate_reports_bad_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, rule: str
) -> None:
    path = write(tmp_path, text, "bad.toml")
    code, out, err = cli(capsys, "validate", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith("simsim: error: ")
    assert f"{path}: {key}: " in err, err
    assert rule in err, err


@pytest.mark.parametrize(("text", "key", "rule"), BAD_SCENARIOS[::4])
def test_cli_run_refuses_bad_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, rule: str
) -> None:
    path = write(tmp_path, text, "bad.toml")
    out_dir = tmp_path / "results"
    code, out, err = cli(capsys, "run", str(path), "--out", str(out_dir))
    assert code == 2
    assert f"{path}: {key}: " in err and rule in err, err
    assert out == ""
    assert not out_dir.exists()


def test_scenario_error_is_a_value_error(tmp_path: Path) -> None:
    path = write(tmp_path, request(0, arrival=1.5))
    with pytest.raises(ValueError, match=r"arrival_time_us"):
        load_scenario(path)


def test_invalid_toml_names_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, ONE + "\nname = = 1\n", "broken.toml")
    message = load_error(path)
    assert str(path) in message and "not valid TOML" in message and "line 8" in message
    code, _, err = cli(capsys, "validate", str(path))
    assert code == 2 and str(path) in err and "not valid TOML" in err


def test_missing_scenario_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nowhere.toml"
    assert "cannot read the file" in load_error(path)
    for argv in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "o")]):
        code, _, err = cli(capsys, *argv)
        assert code == 2
        assert str(path) in err and "cannot read the file" in err
    assert not (tmp_path / "o").exists()


def test_scenario_without_requests_is_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/scenarios.md: "Every section is optional except that a scenario needs some
    # requests." An empty file (or one with only a cost model) has none.
    path = write(tmp_path, EASY_BACKEND, "empty.toml")
    code, out, err = cli(capsys, "validate", str(path))
    assert code == 2, f"accepted a scenario with no requests: {out!r}"
    assert str(path) in err and "request" in err


@pytest.mark.parametrize("rate", ["nan", "inf"])
def test_workload_rate_must_be_a_finite_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rate: str
) -> None:
    path = write(tmp_path, WORKLOAD.replace("rate_per_s = 100.0", f"rate_per_s = {rate}"))
    code, out, err = cli(capsys, "validate", str(path))
    assert code == 2, f"rate_per_s = {rate} accepted: {out!r}"
    assert f"{path}: workload.rate_per_s: " in err, err


def test_workload_arrivals_past_64_bits_are_a_scenario_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # start_time_us is valid on its own, but the generated arrivals pass 2**63 - 1.
    text = WORKLOAD + f"start_time_us = {2**63 - 1000}\n"
    path = write(tmp_path, text)
    code, out, err = cli(capsys, "validate", str(path))
    assert code == 2, f"validate accepted arrivals past 2**63 - 1: {out!r}"
    assert str(path) in err and "workload" in err


# ================================================================ bad CSV traces

# (trace text, key at fault, rule)
BAD_TRACES = [
    pytest.param(
        TRACE_HEADER + "10,5000,256,4\n11,5000,abc,4\n",
        "line 3, column prompt_token_count",
        "must be a non-negative integer, got 'abc'",
        id="non-integer-token-count",
    ),
    pytest.param(
        TRACE_HEADER + "10,1.5,256,4\n",
        "line 2, column arrival_time_us",
        "must be a non-negative integer, got '1.5'",
        id="float-arrival",
    ),
    pytest.param(
        TRACE_HEADER + "10,0,256,4\n11,0,1,-4\n",
        "line 3, column max_output_tokens",
        "must be a non-negative integer, got negative '-4'",
        id="negative-output",
    ),
    pytest.param(
        TRACE_HEADER + "x,0,1,1\n",
        "line 2, column request_id",
        "must be a non-negative integer, got 'x'",
        id="bad-request-id",
    ),
    pytest.param(
        TRACE_HEADER + "10,0,,4\n",
        "line 2, column prompt_token_count",
        "the value is missing; expected a non-negative integer",
        id="empty-cell",
    ),
    pytest.param(
        TRACE_HEADER + f"10,{2**63},1,1\n",
        "line 2, column arrival_time_us",
        "is past the 64-bit limit 2**63 - 1",
        id="past-64-bits",
    ),
    pytest.param(
        TRACE_HEADER + "10,0,1,1\n11,0,1\n",
        "line 3",
        "expected 4 fields, got 3",
        id="too-few-fields",
    ),
    pytest.param(
        TRACE_HEADER + "10,0,1,1,9\n",
        "line 2",
        "expected 4 fields, got 5",
        id="too-many-fields",
    ),
    pytest.param(
        TRACE_HEADER + "10,0,1,1\n\n\n11,0,zz,1\n",
        "line 5, column prompt_token_count",
        "got 'zz'",
        id="line-number-counts-blank-lines",
    ),
    pytest.param(
        "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,1\n5,1,1,1\n",
        "line 3",
        "expected 3 fields, got 4",
        id="no-id-column-wrong-count",
    ),
    pytest.param("", "line 1", "the file is empty; expected a header row", id="empty-file"),
    pytest.param(
        "request_id,arrival_time_us,prompt_token_count\n1,0,1\n",
        "line 1",
        "missing columns ['max_output_tokens']",
        id="missing-column",
    ),
    pytest.param(
        "request_id,arrival_time_us,prompt_tokens,max_output_tokens\n1,0,1,1\n",
        "line 1",
        "missing columns ['prompt_token_count'] (did you mean 'prompt_tokens' for "
        "'prompt_token_count'?)",
        id="misspelt-column",
    ),
]


@pytest.mark.parametrize(("trace", "key", "rule"), BAD_TRACES)
def test_bad_trace_names_trace_file_line_and_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: str, key: str, rule: str
) -> None:
    trace_path = write(tmp_path, trace, "trace.csv")
    scenario = write(tmp_path, EASY_BACKEND + '[trace]\npath = "trace.csv"\n')
    message = load_error(scenario)
    assert f"{trace_path}: {key}: " in message, message
    assert rule in message, message
    with pytest.raises(ScenarioError) as info:
        read_trace_csv(trace_path)
    assert str(info.value) == message
    code, out, err = cli(capsys, "validate", str(scenario))
    assert code == 2 and out == ""
    assert f"{trace_path}: {key}: " in err and rule in err, err
    code, _, err = cli(capsys, "run", str(scenario), "--out", str(tmp_path / "out"))
    assert code == 2 and rule in err
    assert not (tmp_path / "out").exists()


def test_missing_trace_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, '[trace]\npath = "gone.csv"\n')
    message = load_error(scenario)
    assert str(tmp_path / "gone.csv") in message and "does not exist" in message
    assert message.startswith(f"{scenario}: trace.path: ")
    code, _, err = cli(capsys, "validate", str(scenario))
    assert code == 2 and "gone.csv" in err


def test_duplicate_id_inside_a_trace_names_the_trace_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The scenario file has no [[requests]] at all: the duplicate is in the trace, so
    # the message must point there (file and line), not at the scenario's "requests".
    trace_path = write(tmp_path, TRACE_HEADER + "1,0,1,1\n2,3,1,1\n1,5,1,1\n", "trace.csv")
    scenario = write(tmp_path, '[trace]\npath = "trace.csv"\n')
    code, _, err = cli(capsys, "validate", str(scenario))
    assert code == 2
    assert "request id 1 appears twice" in err
    assert str(trace_path) in err, err


def test_duplicate_between_inline_and_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, TRACE_HEADER + "10,0,1,1\n", "trace.csv")
    scenario = write(tmp_path, request(10) + '[trace]\npath = "trace.csv"\n')
    code, _, err = cli(capsys, "validate", str(scenario))
    assert code == 2
    assert str(scenario) in err and "request id 10 appears twice" in err


# =================================================================== CLI arguments


@pytest.mark.parametrize(
    ("seed", "rule"),
    [("-1", "must be >= 0, got -1"), ("9" * 23, f"must be at most 2**63 - 1, got {'9' * 23}")],
)
def test_a_seed_option_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: str, rule: str
) -> None:
    # The rule of [scenario] seed, for the option too.
    code, _, err = cli(capsys, "run", "--seed", seed, "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip() == f"simsim: error: --seed: {rule}"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--seed", "abc"],
        ["run", "--format", "xml"],
        ["validate"],
        ["frobnicate"],
        [],
    ],
)
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: simsim" in capsys.readouterr().err


# ====================================================== valid scenario: hand-worked

HAND = (
    '[scenario]\nname = "hand"\n'
    + EASY_BACKEND
    + request(0, 0, 50, 3)
    + request(1, 10, 0, 5)
    + request(2, 20, 10, 2)
    + request(3, 30, 0, 0)
    + request(4, 5000, 5, 5)
    + request(5, 600, 0, 1)
    + request(6, 700, 0, 1)
    # listed out of time order on purpose
    + cancellation(1000, 4)  # before its arrival at 5000
    + cancellation(100, 2)  # while queued
    + cancellation(120, 2)  # already cancelled: left alone
    + cancellation(350, 1)  # while decoding, at the time of its second decode step
    + cancellation(600, 5)  # at its own arrival time: after the arrival, before admission
    + cancellation(900, 6)  # finished at 810: left alone
)

NA = None
# Hand-worked timeline (prefill = 100 + 2 * prompt, decode = 10):
#   0: 0 arrives, admitted; prefill 200 -> 200; tokens at 210, 220, 230; complete 230
#   10, 20, 30: 1, 2, 3 arrive and queue; 100: 2 cancelled (queued); 120: no-op
#   230: 1 admitted; prefill 100 -> 330; first token 340
#   350: cancellation runs before the decode step due at 350 (it was scheduled first),
#        so 1 keeps 1 token and finishes at 350; 3 is admitted at the end of 350
#   450: 3 prefilled (100) and complete, no tokens
#   600: 5 arrives and is cancelled before the end-of-timestamp admission
#   700: 6 arrives, admitted; prefill 100 -> 800; token and completion at 810
#   900: no-op; 1000: 4 cancelled before its arrival (5000, ignored)
HAND_ROWS = {
    # id: state, tokens, admit, prefill_end, first_token, finish
    0: ("FINISHED", 3, 0, 200, 210, 230),
    1: ("CANCELLED", 1, 230, 330, 340, 350),
    2: ("CANCELLED", 0, NA, NA, NA, 100),
    3: ("FINISHED", 0, 350, 450, NA, 450),
    4: ("CANCELLED", 0, NA, NA, NA, 1000),
    5: ("CANCELLED", 0, NA, NA, NA, 600),
    6: ("FINISHED", 1, 700, 800, 810, 810),
}
ARR, PF, DEC, RC = "REQUEST_ARRIVAL", "PREFILL_COMPLETE", "DECODE_STEP_COMPLETE", "REQUEST_COMPLETE"
HAND_EVENTS = [
    (0, ARR, 0),
    (10, ARR, 1),
    (20, ARR, 2),
    (30, ARR, 3),
    (200, PF, 0),
    (210, DEC, 0),
    (220, DEC, 0),
    (230, DEC, 0),
    (230, RC, 0),
    (330, PF, 1),
    (340, DEC, 1),
    (450, PF, 3),
    (450, RC, 3),
    (600, ARR, 5),
    (700, ARR, 6),
    (800, PF, 6),
    (810, DEC, 6),
    (810, RC, 6),
]
HAND_ADMISSIONS = [(0, 0), (230, 1), (350, 3), (700, 6)]
ROW_FIELDS = ("state", "generated_token_count", "admit_time_us", "prefill_end_time_us")
ROW_FIELDS += ("first_token_time_us", "finish_time_us")


def _check_hand_requests(frame: pd.DataFrame) -> None:
    assert frame["request_id"].tolist() == list(range(7))
    indexed = frame.set_index("request_id")
    for rid, expected in HAND_ROWS.items():
        for column, value in zip(ROW_FIELDS, expected, strict=True):
            got = indexed.loc[rid, column]
            if value is None:
                assert pd.isna(got), (rid, column, got)
            else:
                assert got == value, (rid, column, got)


def test_load_hand_scenario(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, HAND))
    assert scenario.name == "hand"
    assert scenario.engine == "single_slot" and scenario.scheduler == "fcfs"
    assert scenario.backend == simsim.SimulatedBackendConfig(
        prefill_base_us=100, prefill_per_token_us=2, decode_base_us=10
    )
    assert scenario.all_requests()[:2] == [RequestSpec(0, 0, 50, 3), RequestSpec(1, 10, 0, 5)]
    assert len(scenario.all_requests()) == 7
    assert len(scenario.cancellations) == 6


def test_cancellations_applied_at_their_times(tmp_path: Path) -> None:
    engine = run_scenario(load_scenario(write(tmp_path, HAND)))
    _check_hand_requests(engine.requests_frame())
    events = [(r.timestamp_us, r.event_type.name, r.request_id) for r in engine.event_log]
    assert events == HAND_EVENTS
    assert [(a.timestamp_us, a.request_id) for a in engine.admission_log] == HAND_ADMISSIONS


def test_cli_run_hand_scenario_writes_the_worked_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HAND)
    out_dir = tmp_path / "deep" / "results"
    code, out, err = cli(capsys, "run", str(path), "--out", str(out_dir))
    assert code == 0, err
    assert "scenario 'hand'" in out and str(path) in out
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "admissions.csv",
        "events.csv",
        "requests.csv",
        "run.json",
        "summary.csv",
    ]
    _check_hand_requests(pd.read_csv(out_dir / "requests.csv"))
    events = pd.read_csv(out_dir / "events.csv")
    assert list(zip(events.timestamp_us, events.event_type, events.request_id, strict=True)) == (
        HAND_EVENTS
    )
    admissions = pd.read_csv(out_dir / "admissions.csv")
    assert list(zip(admissions.timestamp_us, admissions.request_id, strict=True)) == (
        HAND_ADMISSIONS
    )
    summary = pd.read_csv(out_dir / "summary.csv").set_index("metric")["value"]
    assert summary["requests"] == 7
    assert summary["count_FINISHED"] == 3 and summary["count_CANCELLED"] == 4
    assert summary["makespan_us"] == 1000  # first arrival 0, last finish 1000 (request 4)
    # e2e of finished requests: 230, 420 (450 - 30), 110 (810 - 700)
    assert summary["e2e_latency_us_mean"] == pytest.approx(760 / 3)


# ========================================================= valid: traces, workloads


def test_trace_path_is_relative_to_the_scenario_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "elsewhere"
    here.mkdir()
    # A decoy with the same relative path next to the working directory.
    write(here, TRACE_HEADER + "99,0,1,1\n", "data/trace.csv")
    write(tmp_path / "sub", TRACE_HEADER + "10,5000,256,4\n11,5000,32,12\n", "data/trace.csv")
    scenario = write(tmp_path / "sub", EASY_BACKEND + '[trace]\npath = "data/trace.csv"\n')
    monkeypatch.chdir(here)
    loaded = load_scenario(os.path.relpath(scenario, here))
    assert loaded.all_requests() == [RequestSpec(10, 5000, 256, 4), RequestSpec(11, 5000, 32, 12)]
    code, out, _ = cli(capsys, "validate", str(scenario))
    assert code == 0 and "2 requests" in out


def test_absolute_trace_path(tmp_path: Path) -> None:
    trace = write(tmp_path / "traces", TRACE_HEADER + "3,7,1,2\n", "t.csv")
    scenario = write(tmp_path / "scen", EASY_BACKEND + f"[trace]\npath = '{trace}'\n")
    assert load_scenario(scenario).all_requests() == [RequestSpec(3, 7, 1, 2)]


def test_trace_without_ids_blank_lines_and_spaces(tmp_path: Path) -> None:
    text = (
        " arrival_time_us , prompt_token_count,max_output_tokens\n"
        "900, 4 ,2\n"
        "\n"
        "100,8,0\n"
        "  ,  ,  \n"
        "100,2,1\n"
    )
    trace = write(tmp_path, text, "t.csv")
    # Rows are sorted stably by arrival and numbered from 0 in that order.
    expected = [RequestSpec(0, 100, 8, 0), RequestSpec(1, 100, 2, 1), RequestSpec(2, 900, 4, 2)]
    assert read_trace_csv(trace) == expected
    assert read_trace_csv(trace, first_request_id=50)[0] == RequestSpec(50, 100, 8, 0)
    scenario = load_scenario(write(tmp_path, EASY_BACKEND + '[trace]\npath = "t.csv"\n'))
    assert scenario.all_requests() == expected


def test_header_only_trace_is_an_error(tmp_path: Path) -> None:
    # A trace with a header and no rows is refused: an empty replay is almost always a
    # wrong file or a wrong window, and silence would hide it.
    trace = write(tmp_path, TRACE_HEADER, "t.csv")
    message = load_error(write(tmp_path, ONE + '[trace]\npath = "t.csv"\n'))
    assert message.startswith(f"{trace}: ") and "has a header but no rows" in message


GENERATED = (
    "[scenario]\nseed = 42\n"
    + EASY_BACKEND
    + request(0, 0, 10, 2)
    + """
[workload]
count = 200
rate_per_s = 1000.0
prompt_tokens = [3, 4]
output_tokens = [0, 1]
first_request_id = 100
start_time_us = 5000
"""
)


def _generated(specs: list[RequestSpec]) -> list[RequestSpec]:
    return [s for s in specs if s.request_id >= 100]


def test_workload_is_generated_from_the_seed(tmp_path: Path) -> None:
    path = write(tmp_path, GENERATED)
    first = load_scenario(path)
    assert first.seed == 42
    specs = first.all_requests()
    assert specs == load_scenario(path).all_requests()  # same seed, same requests
    assert specs[0] == RequestSpec(0, 0, 10, 2)
    generated = _generated(specs)
    assert [s.request_id for s in generated] == list(range(100, 300))
    arrivals = [s.arrival_time_us for s in generated]
    assert all(isinstance(a, int) for a in arrivals)
    assert arrivals == sorted(arrivals) and arrivals[0] >= 5000
    # Uniform with both ends included.
    assert {s.prompt_token_count for s in generated} == {3, 4}
    assert {s.max_output_tokens for s in generated} == {0, 1}
    # 200 gaps with a mean of 1000 us: the last arrival is near 5000 + 200_000.
    assert 100_000 < arrivals[-1] - 5000 < 400_000


def test_seed_override_changes_only_generated_requests(tmp_path: Path) -> None:
    path = write(tmp_path, GENERATED)
    base = load_scenario(path).all_requests()
    other = load_scenario(path, seed=7)
    assert other.seed == 7
    assert other.all_requests()[0] == base[0]  # the listed request stays
    assert _generated(other.all_requests()) != _generated(base)
    assert load_scenario(path, seed=7).all_requests() == other.all_requests()
    assert load_scenario(path, seed=42).all_requests() == base
    assert load_scenario(path).with_seed(7).all_requests() == other.all_requests()


def test_cli_seed_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GENERATED)

    def run(name: str, *extra: str) -> str:
        code, _, err = cli(capsys, "run", str(path), "--out", str(tmp_path / name), *extra)
        assert code == 0, err
        return (tmp_path / name / "requests.csv").read_text()

    plain = run("plain")
    assert run("s42", "--seed", "42") == plain  # the file's own seed
    seven = run("s7", "--seed", "7")
    assert run("s7b", "--seed", "7") == seven
    assert seven != plain
    frame7 = pd.read_csv(tmp_path / "s7" / "requests.csv")
    frame42 = pd.read_csv(tmp_path / "plain" / "requests.csv")
    assert frame7.loc[0].equals(frame42.loc[0])  # the listed request is the same
    assert len(frame7) == len(frame42) == 201


def test_cli_run_reports_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GENERATED)
    code, out, _ = cli(capsys, "run", str(path), "--out", str(tmp_path / "o"), "--seed", "7")
    assert code == 0
    assert "seed 7" in out


def test_workload_with_cancellation_of_a_generated_request(tmp_path: Path) -> None:
    path = write(tmp_path, GENERATED + cancellation(0, 150))
    engine = run_scenario(load_scenario(path))
    assert engine.requests[150].state is simsim.RequestState.CANCELLED
    assert engine.requests[150].finish_time_us == 0


# ======================================================================== validate


def test_validate_prints_ok_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("validate must not run the simulation")

    monkeypatch.setattr("simsim.cli.run.run_scenario", boom)
    monkeypatch.setattr("simsim.scenario.run_scenario", boom)
    monkeypatch.setattr(simsim.SimulationEngine, "run", boom)
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, HAND)
    code, out, err = cli(capsys, "validate", str(path))
    assert code == 0 and err == ""
    assert out.startswith(f"{path}: ok")
    assert "7 requests" in out and "6 cancellations" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.toml"]  # nothing written


def test_validate_the_shipped_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "validate", str(EXAMPLE))
    assert code == 0
    assert ": ok: scenario 'small'" in out
    # 2 inline + 3 traced + 20 generated
    assert "25 requests, 1 cancellation\n" in out


# ====================================================================== end to end


def _console_script() -> str:
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    script = shutil.which("simsim", path=search)
    assert script is not None, "the simsim console script is not installed"
    return script


def _run_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def _read(directory: Path, fmt: str) -> dict[str, pd.DataFrame]:
    reader = pd.read_csv if fmt == "csv" else pd.read_parquet
    return {
        name: reader(directory / f"{name}.{fmt}")
        for name in ("requests", "events", "admissions", "summary")
    }


def _check_consistent(tables: dict[str, pd.DataFrame], total: int) -> None:
    requests, events = tables["requests"], tables["events"]
    admissions, summary = tables["admissions"], tables["summary"]
    assert len(requests) == total
    assert requests["request_id"].is_unique
    assert requests["request_id"].is_monotonic_increasing
    assert list(events.columns) == ["timestamp_us", "sequence", "event_type", "request_id"]
    assert list(admissions.columns) == ["timestamp_us", "request_id", "epoch"]
    assert list(summary.columns) == ["metric", "value"]
    assert summary["metric"].tolist() == METRICS

    states = requests["state"]
    finished = requests[states == "FINISHED"]
    cancelled = requests[states == "CANCELLED"]
    assert len(finished) + len(cancelled) == total  # everything ran to the end
    never_arrived = cancelled["finish_time_us"] < cancelled["arrival_time_us"]
    counts = events["event_type"].value_counts()
    assert set(counts.index) <= {ARR, PF, DEC, RC}
    assert counts.get(ARR, 0) == total - int(never_arrived.sum())
    assert counts.get(PF, 0) == int(requests["prefill_end_time_us"].notna().sum())
    assert counts.get(DEC, 0) == int(requests["generated_token_count"].sum())
    assert counts.get(RC, 0) == len(finished)
    assert len(events) == (
        counts.get(ARR, 0) + counts.get(PF, 0) + counts.get(DEC, 0) + counts.get(RC, 0)
    )
    # The log is in (timestamp, sequence) order with unique sequences.
    assert events["sequence"].is_unique
    ordered = events.sort_values(["timestamp_us", "sequence"], kind="stable")
    assert ordered.index.tolist() == events.index.tolist()
    # Per request: completion time = finish time, tokens = decode events.
    completes = events[events["event_type"] == RC].set_index("request_id")["timestamp_us"]
    indexed = requests.set_index("request_id")
    assert (completes == indexed.loc[completes.index, "finish_time_us"]).all()
    decodes = events[events["event_type"] == DEC].groupby("request_id").size()
    tokens = indexed["generated_token_count"]
    assert (decodes == tokens[tokens > 0]).all() and decodes.sum() == tokens.sum()
    # Admissions: one per admitted request, at its admit time.
    admitted = requests[requests["admit_time_us"].notna()]
    assert len(admissions) == len(admitted)
    assert admissions["request_id"].is_unique
    by_admission = admissions.set_index("request_id")["timestamp_us"].sort_index()
    assert by_admission.tolist() == admitted["admit_time_us"].tolist()
    # The summary agrees with the requests table it came from.
    values = summary.set_index("metric")["value"]
    assert values["requests"] == total
    assert values["count_FINISHED"] == len(finished)
    assert values["count_CANCELLED"] == len(cancelled)
    recomputed = simsim.summarize(requests)["value"]
    np.testing.assert_allclose(
        recomputed.to_numpy(), values[recomputed.index].to_numpy(), rtol=1e-12, equal_nan=True
    )


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("default")
    result = _run_process([_console_script(), "run", "--out", "results"], work)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return work / "results", result.stdout


def test_console_script_default_scenario_output(default_run: tuple[Path, str]) -> None:
    directory, stdout = default_run
    assert "scenario 'default' (<built-in default>), seed 0" in stdout
    assert re.search(r"^requests\s+1500\b", stdout, re.MULTILINE), stdout
    assert "results" in stdout and "(csv)" in stdout
    assert "not measured on hardware" in stdout
    assert sorted(p.name for p in directory.iterdir()) == [
        "admissions.csv",
        "events.csv",
        "requests.csv",
        "run.json",
        "summary.csv",
    ]


def test_console_script_default_scenario_tables(default_run: tuple[Path, str]) -> None:
    tables = _read(default_run[0], "csv")
    _check_consistent(tables, 1500)
    requests = tables["requests"].set_index("request_id")
    # The built-in default cancels request 100*k at 60*k seconds (k = 1..7), unless done.
    cancelled = set(requests.index[requests["state"] == "CANCELLED"])
    assert cancelled <= {100 * k for k in range(1, 8)}
    assert cancelled  # the default scenario does exercise cancellation
    for k in range(1, 8):
        row = requests.loc[100 * k]
        if row["state"] == "CANCELLED":
            assert row["finish_time_us"] == 60_000_000 * k
        else:
            assert row["finish_time_us"] <= 60_000_000 * k


MIXED = (
    '[scenario]\nname = "mixed"\nseed = 3\n'
    + EASY_BACKEND
    + request(0, 0, 50, 3)
    + request(1, 0, 0, 0)
    + '[trace]\npath = "trace.csv"\n'
    + """
[workload]
count = 30
rate_per_s = 2000.0
prompt_tokens = [0, 40]
output_tokens = [0, 6]
first_request_id = 100
start_time_us = 100
"""
    + cancellation(500, 102)
    + cancellation(0, 11)
    + cancellation(2_000, 10)
)
MIXED_TRACE = TRACE_HEADER + "10,50,20,4\n11,70,3,2\n12,90,0,9\n"


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    write(tmp_path, MIXED_TRACE, "trace.csv")
    return write(tmp_path, MIXED, "mixed.toml")


def test_module_cli_runs_a_scenario_file(mixed: Path) -> None:
    work = mixed.parent
    result = _run_process(
        [sys.executable, "-m", "simsim.cli", "run", str(mixed), "--out", "out"], work
    )
    assert result.returncode == 0, result.stderr
    assert "scenario 'mixed'" in result.stdout and "seed 3" in result.stdout
    tables = _read(work / "out", "csv")
    _check_consistent(tables, 35)  # 2 inline + 3 traced + 30 generated
    requests = tables["requests"].set_index("request_id")
    assert requests.loc[11, "state"] == "CANCELLED"  # before its arrival at 70
    assert requests.loc[11, "finish_time_us"] == 0
    # The same file run in-process gives the same requests.
    engine = run_scenario(load_scenario(mixed))
    in_process = engine.requests_frame()
    assert tables["requests"]["finish_time_us"].tolist() == in_process["finish_time_us"].tolist()


def test_console_script_and_python_m_simsim_validate(mixed: Path) -> None:
    for argv in ([_console_script()], [sys.executable, "-m", "simsim"]):
        result = _run_process([*argv, "validate", str(mixed)], mixed.parent)
        assert result.returncode == 0, result.stderr
        assert "ok" in result.stdout and "35 requests, 3 cancellations" in result.stdout
    bad = write(mixed.parent, request(0, arrival=1.5), "bad.toml")
    result = _run_process([_console_script(), "validate", str(bad)], mixed.parent)
    assert result.returncode == 2
    assert "requests[0].arrival_time_us" in result.stderr and "float 1.5" in result.stderr


def _assert_same_table(csv: pd.DataFrame, parquet: pd.DataFrame, name: str) -> None:
    assert list(csv.columns) == list(parquet.columns), name
    assert len(csv) == len(parquet), name
    for column in parquet.columns:
        dtype = parquet[column].dtype
        if pd.api.types.is_integer_dtype(dtype):
            left = csv[column].astype("Int64")
            right = parquet[column].astype("Int64")
            assert left.isna().tolist() == right.isna().tolist(), (name, column)
            assert left.dropna().tolist() == right.dropna().tolist(), (name, column)
        elif pd.api.types.is_float_dtype(dtype):
            np.testing.assert_allclose(
                csv[column].astype("float64").to_numpy(),
                parquet[column].astype("float64").to_numpy(),
                rtol=1e-12,
                equal_nan=True,
                err_msg=f"{name}.{column}",
            )
        else:
            assert csv[column].astype(str).tolist() == parquet[column].astype(str).tolist()


def test_parquet_output_matches_csv(mixed: Path) -> None:
    work = mixed.parent
    for fmt in ("csv", "parquet"):
        result = _run_process(
            [_console_script(), "run", str(mixed), "--out", fmt, "--format", fmt], work
        )
        assert result.returncode == 0, result.stderr
        assert f"({fmt})" in result.stdout
    assert sorted(p.name for p in (work / "parquet").iterdir()) == [
        "admissions.parquet",
        "events.parquet",
        "requests.parquet",
        "run.json",
        "summary.parquet",
    ]
    csv_tables = _read(work / "csv", "csv")
    parquet_tables = _read(work / "parquet", "parquet")
    _check_consistent(parquet_tables, 35)
    for name in ("requests", "events", "admissions", "summary"):
        _assert_same_table(csv_tables[name], parquet_tables[name], name)
    # Parquet keeps the nullable integer columns as they were in the frames.
    requests = parquet_tables["requests"]
    for column in ("admit_time_us", "first_token_time_us", "e2e_latency_us", "ttft_us"):
        assert requests[column].dtype == "Int64", column
    assert requests["first_token_time_us"].isna().any()
    assert pd.api.types.is_float_dtype(requests["tpot_us"].dtype)
    assert requests["state"].tolist() == csv_tables["requests"]["state"].tolist()
