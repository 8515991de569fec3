"""The sweep benchmark runs (a quick version): every executor, the same tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "sweeps.py"


def test_sweep_benchmark_quick_run(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("benchmark_sweeps", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    timings = module.main(["--quick"])
    # The script itself asserts that every executor's tables equal the serial run's.
    assert timings[0].executor.startswith("serial")
    assert all(t.runs == 4 * 2 for t in timings)
    assert len(timings) == (3 if importlib.util.find_spec("distributed") else 2)
    assert "speedup over serial" in capsys.readouterr().out
