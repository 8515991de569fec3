"""``simsim plot`` on a cluster's results folder: load per replica, KV transfers.

No pixel tests: the figures are checked for their files and for what their axes hold.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb
from test_cluster_results import cluster_tables, disaggregated, tiny_cluster

import simsim
from simsim import cli, plots
from simsim.run_folder import write_run_folder


def _assert_written(paths: list[Path], names: list[str]) -> None:
    assert [path.name for path in paths] == names
    for path in paths:
        assert path.stat().st_size > 10_000, path


def test_a_cluster_folder_gets_a_replica_load_figure(tmp_path: Path) -> None:
    write_run_folder(tmp_path, cluster_tables(tiny_cluster()), format="csv")
    written = plots.plot_results(tmp_path)
    _assert_written(written, ["latency_cdf.png", "timeline.png", "gantt.png", "replica_load.png"])


def test_simsim_plot_draws_a_disaggregated_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = disaggregated(prefill=2, decode=2)
    for rid in range(6):
        cluster.submit(simsim.Request(rid, rid * 800, 100, rid % 3))
    cluster.run()
    frames = cluster_tables(cluster)
    frames["iterations"] = cluster.iterations_frame()
    write_run_folder(tmp_path, frames, format="parquet")
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path)]) == 0
    names = ["latency_cdf.png", "timeline.png", "gantt.png", "iterations.png", "replica_load.png"]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / name) for name in names]
    _assert_written([tmp_path / name for name in names], names)
    heat = plots.draw_replica_load(frames["requests"])
    assert len(heat.axes) == 6  # per pool: the spread panel, the heat map, its colour bar
    assert [ax.get_ylabel() for ax in heat.axes[1:4:2]] == ["prefill replica", "decode replica"]
    plt.close(heat)


def test_replica_load_series_of_the_tiny_cluster() -> None:
    # On replica 0: requests 0 [0, 220), 2 [300, 400), 4 [330, 510) (arrival to finish);
    # on replica 1: 1 [10, 120), 3 [320, 480). 51 windows of 10 us over [0, 510).
    frame = tiny_cluster().requests_frame()
    edges, pools = simsim.results.replica_load_series(frame, 510, windows=51)
    assert edges[1] - edges[0] == pytest.approx(10)
    [(name, indices, means)] = pools
    assert (name, list(indices)) == ("", [0, 1])
    assert means.shape == (2, 51)
    expected_0 = np.zeros(51)
    expected_0[:22] = 1
    expected_0[30:40] = 1
    expected_0[33:51] += 1
    expected_1 = np.zeros(51)
    expected_1[1:12] = 1
    expected_1[32:48] = 1
    assert means[0] == pytest.approx(expected_0)
    assert means[1] == pytest.approx(expected_1)
    figure = plots.draw_replica_load(frame)
    assert len(figure.axes) == 3  # the spread panel, the heat map, its colour bar
    plt.close(figure)


def test_the_gantt_chart_shows_the_kv_transfer() -> None:
    # Request 0 of test_disaggregation: prefill [0, 3,000), transfer [3,000, 4,500).
    cluster = disaggregated()
    cluster.submit(simsim.Request(0, 0, 100, 3))
    cluster.run()
    figure = plots.draw_gantt(cluster.requests_frame())
    ax = figure.axes[0]
    bars = [
        (tuple(collection.get_facecolor()[0][:3]), tuple(path.get_extents().intervalx))
        for collection in ax.collections
        for path in collection.get_paths()
    ]
    green = to_rgb("#2ca02c")
    transfers = [interval for color, interval in bars if np.allclose(color, green)]
    assert transfers == [pytest.approx((3.0, 4.5))]  # in ms
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "KV transfer to the decode replica" in labels
    plt.close(figure)
    plain = plots.draw_gantt(cluster.requests_frame().drop(columns=["transfer_start_us"]))
    labels = [text.get_text() for text in plain.axes[0].get_legend().get_texts()]
    assert "KV transfer to the decode replica" not in labels
    plt.close(plain)
