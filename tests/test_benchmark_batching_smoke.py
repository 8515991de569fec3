"""The batching benchmark runs (a quick version) and reports what it promises."""

from __future__ import annotations

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "batching.py"


def test_batching_benchmark_quick_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_batching")
    results = module.main(["--quick"])
    assert [r.batch_size for r in results] == [1, 8, 64]
    # One event per iteration: a fuller batch needs fewer events per token.
    per_token = [r.events_per_token for r in results]
    assert per_token[0] > per_token[1] > per_token[2]
    for r in results:
        assert r.events == r.requests + r.iterations  # arrivals + iteration ends
    out = capsys.readouterr().out
    assert "| batch size |" in out and "events/token" in out
    # The cached-sessions table: both runs, and the cache on hits.
    assert "| prefix cache |" in out and "| off |" in out and "| on |" in out
    on = module.run_sessions(True, users=5, turns=3)
    assert on.hit_rate_tokens > 0 and on.requests == 15
