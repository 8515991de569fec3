"""The live-server benchmarks run (tiny sizes, fast servers) and report what they promise.

No timing is asserted: the figures belong to ``docs/performance.md`` ("The live
server"), measured by hand. These runs start ``simsim serve`` in a child process each,
which the benchmarks always stop.
"""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import ROOT, load_script

import simsim

TIMING = ROOT / "benchmarks" / "serve_timing.py"
LOAD = ROOT / "benchmarks" / "serve_load.py"


def test_serve_timing_benchmark_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(TIMING, "benchmark_serve_timing")
    argv = ["--requests", "6", "--concurrency", "1", "2", "--speed", "20", "--warmup", "1"]
    result = module.main(argv)
    assert result.ok, (result.failed, result.table_difference)
    assert [level.concurrency for level in result.levels] == [1, 2]
    for index, level in enumerate(result.levels):
        assert level.requests == 6
        assert level.ttft.count == level.e2e.count == level.health.count == 6
        # One gap between each pair of consecutive tokens of every request.
        outputs = [output for _, output in module.make_jobs(6, 13 + 2 + index)]
        assert level.gap.count == sum(output - 1 for output in outputs)
        for stats in (level.ttft, level.e2e, level.gap, level.health):
            assert stats.min_ms <= stats.median_ms <= stats.p99_ms <= stats.max_ms
    out = capsys.readouterr().out
    assert out.count("| TTFT measured - simulated |") == 2
    assert "| GET /health round trip (baseline) |" in out
    assert "Median difference over the median /health round trip" in out
    assert "equals the offline engine's" in out


def test_serve_load_benchmark_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(LOAD, "benchmark_serve_load")
    result = module.main(["--requests", "40", "--clients", "8", "--speed", "100"])
    assert result.lost == {} and result.table_difference is None
    jobs = module.timing.make_jobs(40, 6, module.PROMPT_TOKENS, module.OUTPUT_TOKENS)
    assert result.tokens == sum(output for _, output in jobs)
    assert result.offline_cpu_s > 0 and result.server_cpu_s >= 0
    out = capsys.readouterr().out
    for row in ("| lost requests | 0 |", "| token throughput |", "| live over offline"):
        assert row in out


def test_serve_load_counts_what_is_lost() -> None:
    module = load_script(LOAD, "benchmark_serve_load")
    Stream = module.timing.Stream

    def stream(rid: int, chunks: int = 2, max_tokens: int = 2) -> object:
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return Stream(
            3, max_tokens, 0.0, 200, [0.1] * chunks, 0.2, {f"cmpl-{rid}"}, "length", usage
        )

    rows = pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "state": ["FINISHED", "FINISHED", "RUNNING", "FINISHED"],
            "prompt_token_count": [3, 3, 3, 3],
            "max_output_tokens": [2, 2, 2, 2],
            "generated_token_count": [2, 2, 1, 2],
        }
    )
    rows.index = rows["request_id"].to_numpy()
    good = [stream(0), stream(1), stream(2), stream(3)]
    assert module.lost_requests(good, rows) == {"recorded as RUNNING": 1}
    lost = module.lost_requests([stream(0), stream(0), stream(1, chunks=1), stream(9)], rows)
    assert lost == {
        "duplicated id": 1,
        "1 content chunks for max_tokens 2": 1,
        "not in the recorded table": 1,
        "recorded but not answered": 2,  # 2 and 3; 1 was answered, wrongly
    }


def test_recorded_table_check_catches_one_microsecond() -> None:
    module = load_script(TIMING, "benchmark_serve_timing")
    engine = module.build_engine(None)
    for rid in range(3):
        engine.submit(simsim.Request(rid, rid * 1_000, 10, 4))
    engine.run()
    recorded = engine.requests_frame()
    offline, _ = module.run_offline(recorded, None)
    assert module.first_difference(recorded, offline.requests_frame()) is None
    recorded.loc[1, "finish_time_us"] += 1
    difference = module.first_difference(recorded, offline.requests_frame())
    assert difference is not None and "'request_id': 1" in difference
