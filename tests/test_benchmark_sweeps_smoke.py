"""The sweep benchmark runs (a quick version): every executor, the same tables."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "sweeps.py"


def test_sweep_benchmark_quick_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_sweeps")
    timings = module.main(["--quick"])
    # The script itself asserts that every executor's tables equal the serial run's.
    assert timings[0].executor.startswith("serial")
    assert all(t.runs == 4 * 2 for t in timings)
    assert len(timings) == (3 if importlib.util.find_spec("distributed") else 2)
    assert "speedup over serial" in capsys.readouterr().out
