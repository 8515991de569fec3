"""The scheduler benchmark runs (its --quick version) and prints what it promises.

The statistical agreement is checked by tests/test_validation_priority.py at a larger
size; this only shows that the script works end to end, that its exact replay agrees
with the engine for every policy, and that the quick run already shows the trade-off
the documentation describes.
"""

from __future__ import annotations

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "schedulers.py"


def test_scheduler_benchmark_quick_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_schedulers")
    priority_results, sjf = module.main(["--quick"])
    out = capsys.readouterr().out

    assert [len(r.estimates) for r in priority_results] == [2, 3]
    assert all(r.mismatches == 0 for r in priority_results)
    for result in priority_results:
        for job_class in result.case.classes:
            assert f"| {job_class.name} | {job_class.priority} | {job_class.rho:g} |" in out

    assert list(sjf.policies) == ["fcfs", "sjf", "sjf+aging"]
    fcfs, plain, aging = (sjf.policies[name] for name in ("fcfs", "sjf", "sjf+aging"))
    assert all(p.mismatches == 0 for p in (fcfs, plain, aging))
    # SJF halves the mean response; it makes the long jobs' tail far worse, and aging
    # pulls that tail back while keeping most of the gain.
    assert plain.response.mean < fcfs.response.mean / 2
    assert plain.long_response_p99_us > 2 * fcfs.long_response_p99_us
    assert aging.long_response_p99_us < plain.long_response_p99_us / 1.5
    assert aging.response.mean < fcfs.response.mean / 2
    for line in ("| fcfs | 39.5 |", "| sjf | 12.1 |", "| sjf+aging | - |"):
        assert line in out
    assert "not measured on any hardware" in out
