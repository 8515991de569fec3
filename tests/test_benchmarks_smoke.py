"""The solver benchmark runs (its --quick version) and checks every solver's answers.

No timing is asserted anywhere: the numbers belong to ``docs/performance.md``, measured
by hand. This only shows that the script works end to end and that its agreement check
has teeth.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "solvers.py"
SOLVERS = ("closed_form", "raw_simpy", "simsim", "simsim_fast")


def test_solver_benchmark_quick_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_solvers")

    plot, markdown = tmp_path / "scaling.png", tmp_path / "tables.md"
    assert module.main(["--quick", "--plot", str(plot), "--markdown", str(markdown)]) == 0
    out = capsys.readouterr().out
    assert "All solvers agree with closed_form" in out
    assert "measured in one process on this machine" in out
    table = out.split("Main comparison", 1)[1].split("Events per solver", 1)[0]
    rows = [line.split()[0] for line in table.splitlines()[4:] if line.strip()]
    assert rows == list(SOLVERS)
    assert plot.stat().st_size > 0
    assert "| simsim_fast |" in markdown.read_text(encoding="utf-8")

    # The check the run passed does fail on a one-microsecond difference.
    workload = module.make_workload(50)
    reference = module.solve_closed_form(workload).timeline
    finish = list(reference.finish_us)
    finish[7] += 1
    with pytest.raises(module.DisagreementError, match="request 7 has finish_us"):
        module.check_agreement(
            "off_by_one", dataclasses.replace(reference, finish_us=finish), reference
        )
