"""Mooncake traces (JSON lines with hash_ids): reading, scenario files, the shipped sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import load_script

import simsim
from simsim.scenario import ScenarioError, load_scenario, run_scenario
from simsim.traces import SAMPLE_MOONCAKE_TRACE, TraceError, read_mooncake_trace

ROOT = Path(__file__).resolve().parent.parent


def write(path: Path, *rows: object) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_rows_become_requests_with_their_full_blocks_hashes(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.jsonl",
        {"timestamp": 1.5, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [4], "x": 1},
    )
    first, second = read_mooncake_trace(trace)
    assert (first.request_id, first.arrival_time_us, first.block_hashes) == (0, 0, (4,))
    # 1100 tokens: two full blocks of 512; the partial third block is never shared.
    assert (second.arrival_time_us, second.prompt_token_count, second.block_hashes) == (
        1500,
        1100,
        (4, 5),
    )
    assert second.max_output_tokens == 7
    assert [r.block_hashes for r in read_mooncake_trace(trace, block_hashes=False)] == [None, None]
    fast = read_mooncake_trace(trace, time_scale=2, first_request_id=10)
    assert [r.request_id for r in fast] == [10, 11]
    assert fast[1].arrival_time_us == 750 and fast[1].block_hashes == (4, 5)
    # Read with another block size, the ids do not cover the prompts: refused, not guessed.
    with pytest.raises(TraceError, match="3 hash_ids for 1100 input tokens, which fill 5"):
        read_mooncake_trace(trace, block_size_tokens=256)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: not a JSON object"),
        ("[1, 2]", "line 1: each line must be a JSON object"),
        (
            '{"timestamp": 0, "input_length": 1}',
            "line 1: missing keys ['output_length', 'hash_ids']",
        ),
        (
            '{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}',
            "line 1, column timestamp: must be a number of milliseconds >= 0",
        ),
        (
            '{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": []}',
            "line 1, column input_length: must be an integer >= 0",
        ),
        (
            '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}',
            "line 1, column hash_ids: must be a list of integers",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [7, 7]}',
            "line 1, column hash_ids: repeats a hash id",
        ),
        ("", "the trace holds no request"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_mooncake_trace(path)


SCENARIO = """
[scenario]
engine = "batching"

[backend]
prefill_base_us = 2_000
prefill_per_token_us = 20
decode_base_us = 8_000

[batching]
max_active_requests = 8

[kv_cache]
block_size_tokens = 512
total_blocks = 400

[prefix_cache]
enabled = true

[trace]
path = "{path}"
format = "mooncake"
"""


def test_the_sample_trace_replays_with_cache_hits(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(path=SAMPLE_MOONCAKE_TRACE), encoding="utf-8")
    engine = run_scenario(load_scenario(path))
    frame = engine.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    summary = simsim.summarize(frame)["value"]
    # Every conversation's later turns and every shared system prompt can hit.
    assert 0.3 < summary["prefix_cache_hit_rate_tokens"] < 1
    assert summary["prefix_cache_hit_rate_requests"] > 0.5
    off = tmp_path / "off.toml"
    off.write_text(path.read_text().replace("[prefix_cache]\nenabled = true\n", ""), "utf-8")
    # Without a prefix cache the trace's hash_ids are checked but not attached: the
    # server would refuse requests naming blocks nothing shares.
    without = load_scenario(off)
    assert all(spec.block_hashes is None for spec in without.requests)
    plain = run_scenario(without).requests_frame()
    # Skipping cached prefills makes first tokens come sooner on average.
    assert frame["ttft_us"].mean() < plain["ttft_us"].mean()


def test_the_trace_and_the_cache_must_agree_on_the_block_size(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    text = SCENARIO.format(path=SAMPLE_MOONCAKE_TRACE).replace(
        "block_size_tokens = 512", "block_size_tokens = 16"
    )
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"trace\.block_size_tokens: the trace's hash_ids"):
        load_scenario(path)
    # Both set to 16: the trace's ids (512-token blocks) do not cover its prompts.
    path.write_text(text + "block_size_tokens = 16\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="is block_size_tokens the trace's own"):
        load_scenario(path)
    bad = SCENARIO.format(path=SAMPLE_MOONCAKE_TRACE).replace('format = "mooncake"', "")
    path.write_text(bad + "block_size_tokens = 16\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match='only for format "mooncake"'):
        load_scenario(path)


def test_the_shipped_sample_is_what_its_script_writes() -> None:
    script = load_script(ROOT / "benchmarks" / "make_sample_trace.py", "make_sample_trace")
    assert script.render_mooncake() == Path(str(SAMPLE_MOONCAKE_TRACE)).read_text("utf-8")
