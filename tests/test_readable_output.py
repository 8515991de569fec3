"""Output a person reads (issue 24, point 9): prose, not metric names; counts that
agree with their nouns; whole-number ticks on axes of counts and replica indices.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.axis import Axis
from test_class_scenario import ADMISSION, scenario_text
from test_cluster_results import EASY, cluster_tables

import simsim
from simsim import plots
from simsim.admission import REJECTION_REASONS
from simsim.cli import main, report
from simsim.cluster import Cluster
from simsim.wording import counted


def run_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> str:
    path = tmp_path / "scenario.toml"
    path.write_text(text, encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    return capsys.readouterr().out


def test_counted_puts_the_noun_in_the_plural_unless_there_is_one() -> None:
    assert counted(1, "replica") == "1 replica"
    assert [counted(n, "replica") for n in (0, 2)] == ["0 replicas", "2 replicas"]
    assert counted(1, "other class", "other classes") == "1 other class"
    assert counted(3, "other class", "other classes") == "3 other classes"
    assert counted(1, "finished request", "finished requests") == "1 finished request"


# ---------------------------------------------------------------------- the run table


def test_the_requests_line_says_why_requests_were_rejected_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = scenario_text().replace("output_tokens = 30", "output_tokens = 3000")
    printed = run_printed(tmp_path, capsys, text + ADMISSION.format(key="class"))
    line = next(line for line in printed.splitlines() if line.startswith("requests "))
    assert "_" not in line  # no metric names (rejected_rate_limited) in the prose
    found = re.fullmatch(
        r"requests      38 \(finished (\d+), cancelled (\d+), of which "
        r"(\d+) rejected: (\d+) rate-limited, (\d+) with the queue full\)",
        line,
    )
    assert found is not None, line
    finished, cancelled, rejected, limited, full = (int(n) for n in found.groups())
    assert finished + cancelled == 38 and rejected == cancelled == limited + full
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("metric")["value"]
    assert (limited, full) == (
        summary["count_rejected_rate_limited"],
        summary["count_rejected_queue_full"],
    )


def test_every_rejection_reason_has_its_words() -> None:
    assert set(report._REJECTIONS) == set(REJECTION_REASONS)


ONE_OF_EACH = """
[scenario]
engine = "batching"
[backend]
prefill_base_us = 100
prefill_per_token_us = 1
decode_base_us = 10
[batching]
max_active_requests = 2
[kv_cache]
block_size_tokens = 4
total_blocks = {blocks}
"""


def request(rid: int, prompt: int, output: int) -> str:
    return (
        f"[[requests]]\nrequest_id = {rid}\narrival_time_us = 0\n"
        f"prompt_token_count = {prompt}\nmax_output_tokens = {output}\n"
    )


def test_counts_of_one_take_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One zero-output request: one iteration, one event of each kind, one block.
    printed = run_printed(tmp_path, capsys, ONE_OF_EACH.format(blocks=1) + request(0, 4, 0))
    assert "batching      1 iteration, " in printed
    assert "KV cache      " in printed and " of 1 block in use on average" in printed
    assert re.search(r"^queue delay .*   1 admitted request$", printed, re.MULTILINE)
    assert re.search(r"^e2e latency .*   1 finished request$", printed, re.MULTILINE)
    # Two requests of 1 prompt token and 4 outputs in 2 blocks of 4: one is preempted.
    printed = run_printed(
        tmp_path, capsys, ONE_OF_EACH.format(blocks=2) + request(0, 1, 4) + request(1, 1, 4)
    )
    assert re.search(r"^batching      \d+ iterations, .*, 1 preemption$", printed, re.MULTILINE)
    for plural in re.finditer(r"\b1 (\w+s)\b", printed):
        assert plural[1] in {"ms"}, plural[0]


def test_a_cluster_of_one_replica_says_replica() -> None:
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(EASY))
    cluster = Cluster([engine])
    assert repr(cluster) == "<Cluster of 1 replica>"
    with pytest.raises(ValueError, match=r"is a replica of <Cluster of 1 replica>"):
        engine.submit(simsim.Request(0, 0, 1, 1))
    busy = simsim.SimulationEngine(simsim.SimulatedBackend(EASY))
    busy.submit(simsim.Request(0, 0, 1, 1))
    with pytest.raises(ValueError, match=r"already has 1 submitted request; "):
        Cluster([busy])


def test_a_pool_of_one_replica_says_how_busy_it_was_not_a_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = ONE_OF_EACH.format(blocks=8) + request(0, 4, 2) + "[cluster]\nreplicas = 1\n"
    printed = run_printed(tmp_path, capsys, text)
    (line,) = [line for line in printed.splitlines() if line.startswith("balance")]
    assert re.fullmatch(r"balance       replica busy \d+\.\d% of the time \(the only one\)", line)


# ---------------------------------------------------------------------- figures


def whole_ticks(axis: Axis) -> list[float]:
    """The axis's ticks inside its view, which must all be whole numbers."""
    low, high = sorted(axis.get_view_interval())
    ticks = [tick for tick in axis.get_majorticklocs() if low <= tick <= high]
    assert ticks, "no tick in view"
    assert all(tick == round(tick) for tick in ticks), ticks
    return ticks


def test_one_replicas_figures_tick_whole_numbers() -> None:
    env = simsim.Environment()
    replica = simsim.BatchingEngine(
        simsim.SimulatedBackend(EASY),
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(16, 8),
        env=env,
    )
    cluster = Cluster([replica])
    cluster.submit(simsim.Request(0, 0, 10, 0))  # one iteration, nothing ever queued
    cluster.run()
    frames = cluster_tables(cluster)
    heat_map = plots.draw_replica_load(frames["requests"])
    assert heat_map.axes[1].get_ylabel() == "replica"
    assert whole_ticks(heat_map.axes[1].yaxis) == [0]
    assert heat_map.get_suptitle().startswith("Requests on the one replica over time, ")
    timeline = plots.draw_timeline(frames["requests"])
    for ax in timeline.axes:
        whole_ticks(ax.yaxis)
    iterations = plots.draw_iterations(cluster.iterations_frame())
    for ax in iterations.axes:  # batch size, KV blocks (here), tokens per iteration
        whole_ticks(ax.yaxis)
    for figure in (heat_map, timeline, iterations):
        plt.close(figure)


def test_a_sweep_over_replicas_ticks_whole_replica_counts() -> None:
    rows = [
        {"replicas": n, "metric": metric, "mean": value, "ci_low": value, "ci_high": value}
        for n in (1, 2)
        for metric, value in (("throughput_requests_per_s", 10.0 * n), ("ttft_us_p99", 1e5))
    ]
    folder = simsim.sweeps.SweepFolder(Path("sweep"), pd.DataFrame(rows), "replicas", (), 0.95)
    figure = plots.draw_sweep_throughput(folder)
    assert whole_ticks(figure.axes[0].xaxis) == [1, 2]
    plt.close(figure)
