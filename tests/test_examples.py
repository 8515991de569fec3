"""Every example runs, prints exactly its committed output, and returns sane results.

Simulations are deterministic, so an example's printed report is a contract: the golden
files in tests/golden/ are compared line for line. Regenerate one deliberately with
``python examples/NAME.py > tests/golden/NAME.txt`` when a change is meant to alter it
(for an example that draws figures, ``python examples/NAME.py --out OUT``, then delete
the ``OUT`` folder: golden files name the figure folder ``OUT``).

The cluster scenario and sweep files are golden too: ``simsim run`` (``simsim sweep``
with ``--workers 1``) prints the text in ``tests/golden/scenarios/`` (``sweeps/``), with
the results folder written as ``OUT`` and the wall time as ``X``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, load_script

EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"

SCRIPTS = sorted(path.stem for path in EXAMPLES.glob("*.py"))

#: The figures each drawing example writes into the folder given with ``--out``.
FIGURES = {"batching_vs_single_slot": ["batching_vs_single_slot.png"]}


def load(name: str) -> ModuleType:
    return load_script(EXAMPLES / f"{name}.py", f"example_{name}")


def test_every_example_has_a_golden_output() -> None:
    assert SCRIPTS, "no examples found"
    assert sorted(path.stem for path in GOLDEN.glob("*.txt")) == SCRIPTS


def _run_example(name: str, cwd: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_prints_its_golden_output(name: str, tmp_path: Path) -> None:
    # Run from an empty folder: an example writes nothing there; figures go to --out.
    work, out = tmp_path / "work", tmp_path / "figures"
    work.mkdir()
    args = ["--out", str(out)] if name in FIGURES else []
    stdout = _run_example(name, work, *args)
    assert stdout.replace(str(out), "OUT") == (GOLDEN / f"{name}.txt").read_text()
    assert list(work.iterdir()) == []
    if name in FIGURES:
        assert sorted(path.name for path in out.iterdir()) == FIGURES[name]
        for figure in FIGURES[name]:
            assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not out.exists()


#: Example files ``simsim run`` or ``simsim sweep`` prints a golden report for.
CLI_EXAMPLES = (
    "scenarios/cluster",
    "scenarios/disaggregated",
    "scenarios/inference_perf",
    "sweeps/cluster_replicas",
)


@pytest.mark.parametrize("example", CLI_EXAMPLES)
def test_cli_example_prints_its_golden_output(
    example: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from simsim.cli import main

    monkeypatch.chdir(ROOT)  # the report names the file as given: examples/...
    out = tmp_path / "out"
    command = example.partition("/")[0].removesuffix("s")  # "scenario" or "sweep"
    args = ["run"] if command == "scenario" else ["sweep", "--workers", "1"]
    assert main([*args, f"examples/{example}.toml", "--out", str(out)]) == 0
    printed = re.sub(r"in \d+\.\d\d s of wall time", "in X s of wall time", capsys.readouterr().out)
    assert printed.replace(str(out), "OUT") == (GOLDEN / f"{example}.txt").read_text()


def test_figures_default_to_a_results_folder_never_the_current_one(tmp_path: Path) -> None:
    for name, figures in FIGURES.items():
        module = load(name)
        assert module.parse_args([]) == Path("simsim-results") / "examples"
        assert module.parse_args(["--out", str(tmp_path)]) == tmp_path
        assert module.parse_args(["--no-plot"]) is None
        afile = tmp_path / "afile"
        afile.write_text("")
        with pytest.raises(SystemExit) as refused:  # before the runs, not after them
            module.parse_args(["--out", str(afile)])
        assert refused.value.code == 2
        for figure in figures:
            assert Path(figure).name == figure  # a file name inside the folder, no path


def test_open_loop_finishes_every_request(capsys: pytest.CaptureFixture[str]) -> None:
    summary = load("open_loop").main(seed=7, count=200)["value"]
    assert summary["requests"] == 200
    assert summary["count_FINISHED"] == 200
    # Requests wait in the queue, but every latency is at least its own queueing delay.
    assert summary["e2e_latency_us_mean"] > summary["queue_delay_us_mean"] > 0
    assert "finished:        200" in capsys.readouterr().out


def test_closed_loop_throughput_rises_then_saturates() -> None:
    results = load("closed_loop").main()
    throughputs = [results[users][0] for users in sorted(results)]
    latencies = [results[users][1] for users in sorted(results)]
    assert throughputs == sorted(throughputs)
    assert latencies == sorted(latencies)
    # Doubling 8 -> 16 users gains far less than doubling 1 -> 2: the slot saturates.
    assert throughputs[4] / throughputs[3] < throughputs[1] / throughputs[0]


def test_client_timeouts_more_patience_fewer_cancellations() -> None:
    results = load("client_timeouts").main()
    for counts in results.values():
        assert counts["finished"] + counts["cancelled"] == 300
        assert (
            counts["cancelled_while_queued"] + counts["cancelled_while_running"]
            == counts["cancelled"]
        )
    cancelled = [results[patience]["cancelled"] for patience in sorted(results)]
    assert cancelled == sorted(cancelled, reverse=True)


def test_load_balancer_shares_the_load_and_keeps_running() -> None:
    result = load("load_balancer").main()
    # The monitor sampled every 100 ms for 30 s; its process never ends.
    assert result["samples"] == 300
    finished = [result[f"server{i}"]["count_FINISHED"] for i in range(2)]  # type: ignore[index]
    assert all(count > 200 for count in finished)
    assert abs(finished[0] - finished[1]) < 0.25 * sum(finished)


def test_scenario_example_validates_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from simsim.cli import main

    scenario = EXAMPLES / "scenarios" / "small.toml"
    assert main(["validate", str(scenario)]) == 0
    assert "25 requests, 1 cancellation\n" in capsys.readouterr().out
    assert main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    requests = pd.read_csv(tmp_path / "requests.csv")
    # 2 inline + 3 traced + 20 generated; request 102 cancelled at 0.4 s.
    assert len(requests) == 25
    cancelled = requests[requests["state"] == "CANCELLED"]
    assert cancelled["request_id"].tolist() == [102]
    assert cancelled["finish_time_us"].tolist() == [400_000]
    assert (requests[requests["request_id"] != 102]["state"] == "FINISHED").all()


def test_bursty_scenario_example_runs_and_cancels_impatient_clients(tmp_path: Path) -> None:
    import pandas as pd

    from simsim.cli import main

    scenario = EXAMPLES / "scenarios" / "bursty.toml"
    for run in ("a", "b"):
        assert main(["run", str(scenario), "--out", str(tmp_path / run)]) == 0
    first = pd.read_csv(tmp_path / "a" / "requests.csv")
    second = pd.read_csv(tmp_path / "b" / "requests.csv")
    pd.testing.assert_frame_equal(first, second)  # same seed, same results
    assert len(first) == 400
    states = first["state"].value_counts()
    assert states["FINISHED"] + states["CANCELLED"] == 400
    assert states["CANCELLED"] > 0  # patience deadlines fired


def test_batching_beats_the_single_slot_under_load(tmp_path: Path) -> None:
    table = load("batching_vs_single_slot").main(tmp_path / "figures")
    assert (tmp_path / "figures" / "batching_vs_single_slot.png").read_bytes()[:4] == b"\x89PNG"
    single = table[table["server"] == "single slot"].set_index("rate_per_s")
    batching = table[table["server"] == "batching"].set_index("rate_per_s")
    # Light load: both keep up, so both carry the same tokens per second (within 1%).
    assert abs(single.loc[0.25, "tokens_per_s"] / batching.loc[0.25, "tokens_per_s"] - 1) < 0.01
    # Heavy load: the single slot saturates; batching carries many times more, faster.
    assert single.loc[8.0, "tokens_per_s"] == pytest.approx(single.loc[2.0, "tokens_per_s"], 0.01)
    assert batching.loc[8.0, "tokens_per_s"] > 5 * single.loc[8.0, "tokens_per_s"]
    assert (batching["e2e_p90_ms"] <= single["e2e_p90_ms"]).all()


def test_capacity_planning_brackets_the_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    found = load("capacity_planning").main(workers=2)
    low, high = found.interval
    assert found.status == "found" and found.value == low
    assert high - low <= 0.25
    verdicts = dict(zip(found.evaluations["value"], found.evaluations["verdict"], strict=True))
    assert verdicts[low] == "meets" and verdicts[high] != "meets"
    assert "Capacity:" in capsys.readouterr().out


def test_serve_openai_client_times_the_lone_requests_by_the_cost_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    requests = load("serve_openai_client").main()
    assert (requests["state"] == "FINISHED").all() and len(requests) == 8
    tokens = requests["generated_token_count"].tolist()
    assert tokens[:2] == [5, 4] and sorted(tokens[2:]) == [8, 12, 16, 20, 24, 28]
    # The first two ran alone: prefill 2000 + 50 x prompt, then 8250 us per token.
    first, second = requests.iloc[0], requests.iloc[1]
    assert (first["ttft_us"], first["e2e_latency_us"]) == (2_000 + 50 * 5 + 8_250, 43_500)
    assert (second["ttft_us"], second["e2e_latency_us"]) == (2_000 + 50 * 8 + 8_250, 35_400)
    assert "same request table: True" in capsys.readouterr().out


def test_cluster_routing_prefix_affinity_keeps_the_cache_warm() -> None:
    rows = load("cluster_routing").main()
    assert rows["round_robin"]["busiest"] == rows["round_robin"]["idlest"]  # 1,200 / 8 each
    for router in ("prefix_affinity", "weighted", "bounded_affinity"):
        assert rows[router]["hit_rate"] > rows["round_robin"]["hit_rate"] + 0.4
        assert rows[router]["ttft_ms_p99"] < rows["least_outstanding"]["ttft_ms_p99"]
    # the load bound narrows the spread plain affinity leaves
    spread = {name: rows[name]["busiest"] - rows[name]["idlest"] for name in rows}
    assert spread["bounded_affinity"] < spread["prefix_affinity"]


def test_sjf_vs_fcfs_shortest_first_wins_on_average_and_aging_bounds_the_long_jobs() -> None:
    table = load("sjf_vs_fcfs").main(count=600)
    fcfs, sjf, aged = (table.loc[name] for name in table.index)
    assert sjf["mean"] < fcfs["mean"] and sjf["chat mean"] < fcfs["chat mean"]
    assert sjf["report p99"] > fcfs["report p99"]  # the price of shortest first
    assert aged["report max"] < sjf["report max"]  # aging bounds the long jobs' wait
