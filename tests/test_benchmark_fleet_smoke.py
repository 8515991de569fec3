"""The fleet benchmark runs (its --quick version) and prints what it promises.

No timing is asserted: the figures belong to ``docs/performance.md``, measured by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "fleet.py"


def test_fleet_benchmark_quick_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_fleet")
    plot = tmp_path / "fleet.png"
    assert module.main(["--quick", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "side by side" in out and "| round_robin |" in out and "| power_of_two |" in out
    assert "Requests through 4 replicas" in out and "requests on more replicas" in out
    assert plot.stat().st_size > 0


def test_a_fleet_run_counts_every_request() -> None:
    module = load_script(SCRIPT, "benchmark_fleet")
    run = module.simulate(300, 3, "power_of_two", stretches=True)
    slow = module.simulate(300, 3, "power_of_two", stretches=False)
    assert run.requests == 300 and run.replicas == 3
    assert run.events == slow.events and run.tokens == slow.tokens  # the same work
    assert run.peak_rss_mb > 0 and run.wall_s > 0


def test_a_baseline_runs_on_another_checkout() -> None:
    """``--baseline``: a run on a git worktree's simsim, removed afterwards."""
    module = load_script(SCRIPT, "benchmark_fleet")
    with module.checkout("HEAD") as tree:
        assert (tree / "simsim" / "__init__.py").exists()
        run = module.measure(200, 2, "round_robin", None, simsim_path=tree)
    assert run.requests == 200 and run.tokens > 0
    assert not tree.exists()
