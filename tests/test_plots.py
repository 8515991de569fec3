"""simsim.plots: figures from a results folder, and the series behind the timeline.

Results folders are written by ``simsim run`` itself (``cli.main``) from small scenario
files, in CSV and in parquet, so the plots read exactly what users will have on disk.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import simsim
from simsim import cli, plots
from simsim.request import Request
from simsim.results import requests_frame
from simsim.run_folder import read_run_folder
from simsim.scenario import load_scenario, run_scenario

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BACKEND = """
[backend]
prefill_base_us = 100
prefill_per_token_us = 2
prefill_per_active_sequence_us = 0
decode_base_us = 10
decode_per_active_sequence_us = 0
"""

# prefill = 100 + 2 * prompt, decode step = 10 (us). Request 4 is cancelled while queued,
# 5 before it arrives, 6 while decoding; 1 has no output (no first token, no TTFT).
SMALL_TOML = (
    '[scenario]\nname = "plots-small"\n'
    + BACKEND
    + "".join(
        f"\n[[requests]]\nrequest_id = {i}\narrival_time_us = {a}\n"
        f"prompt_token_count = {p}\nmax_output_tokens = {o}\n"
        for i, a, p, o in (
            (0, 0, 10, 2),
            (2, 50, 5, 1),
            (1, 50, 0, 0),
            (3, 60, 20, 3),
            (4, 300, 10, 5),
            (5, 1000, 10, 5),
            (6, 2000, 50, 20),
            (7, 2010, 30, 4),
        )
    )
    + "".join(
        f"\n[[cancellations]]\ntime_us = {t}\nrequest_id = {r}\n"
        for t, r in ((350, 4), (500, 5), (2250, 6))
    )
)


def workload_toml(count: int) -> str:
    return (
        '[scenario]\nname = "plots-generated"\nseed = 3\n'
        + BACKEND
        + f"\n[workload]\ncount = {count}\nrate_per_s = 2000.0\n"
        "prompt_tokens = [10, 200]\noutput_tokens = [0, 30]\n"
    )


def run_cli(tmp: Path, toml: str, fmt: str) -> Path:
    """Write *toml* to a file, ``simsim run`` it into a fresh folder, return the folder."""
    scenario = tmp / "scenario.toml"
    scenario.write_text(toml)
    out = tmp / f"results-{fmt}"
    assert cli.main(["run", str(scenario), "--out", str(out), "--format", fmt]) == 0
    assert (out / f"requests.{fmt}").is_file()
    return out


@pytest.fixture(scope="module", params=["csv", "parquet"])
def small_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    fmt: str = request.param
    return run_cli(tmp_path_factory.mktemp(f"small-{fmt}"), SMALL_TOML, fmt)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"
    image = matplotlib.image.imread(path)
    height, width, channels = image.shape
    assert channels in (3, 4)
    assert width >= 800 and height >= 300
    assert float(image[..., :3].std()) > 0.05, f"{path} looks blank"


# ---------------------------------------------------------------------- plot_results


def test_plot_results_writes_the_three_figures_in_order(small_results: Path) -> None:
    written = plots.plot_results(small_results, None)
    assert written == [
        small_results / "latency_cdf.png",
        small_results / "timeline.png",
        small_results / "gantt.png",
    ]
    for path in written:
        assert_png(path)


def test_plot_results_writes_to_out_dir_and_creates_it(small_results: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures" / "nested"
    written = plots.plot_results(small_results, out)
    assert [p.parent for p in written] == [out] * 3
    assert sorted(p.name for p in out.iterdir()) == ["gantt.png", "latency_cdf.png", "timeline.png"]
    assert_png(out / "timeline.png")


@pytest.mark.parametrize(("count", "gantt"), [(60, True), (61, False)])
def test_gantt_is_written_only_for_small_runs(tmp_path: Path, count: int, gantt: bool) -> None:
    results = run_cli(tmp_path, workload_toml(count), "csv")
    assert len(pd.read_csv(results / "requests.csv")) == count
    written = plots.plot_results(results, None)
    names = [p.name for p in written]
    expected = ["latency_cdf.png", "timeline.png"] + (["gantt.png"] if gantt else [])
    assert names == expected
    assert (results / "gantt.png").exists() is gantt
    for path in written:
        assert_png(path)


def test_an_empty_results_folder_still_plots(tmp_path: Path) -> None:
    requests_frame([]).to_csv(tmp_path / "requests.csv", index=False)
    written = plots.plot_results(tmp_path, None)
    assert [p.name for p in written] == ["latency_cdf.png", "timeline.png", "gantt.png"]
    for path in written:
        assert path.read_bytes()[:8] == PNG_SIGNATURE


# ---------------------------------------------------------------------- reading


def test_both_formats_read_back_as_the_engine_frame(small_results: Path, tmp_path: Path) -> None:
    scenario_file = tmp_path / "scenario.toml"
    scenario_file.write_text(SMALL_TOML)
    expected = run_scenario(load_scenario(scenario_file)).requests_frame()
    read = read_run_folder(small_results).requests()
    pd.testing.assert_frame_equal(read, expected)
    # The scenario does what its comment says, so every figure has its edge cases.
    states = dict(zip(read["request_id"], read["state"], strict=True))
    assert [states[i] for i in (4, 5, 6)] == ["CANCELLED"] * 3
    assert read["admit_time_us"].isna().sum() == 2  # 4 (queued) and 5 (never arrived)
    assert pd.isna(read.set_index("request_id").loc[1, "ttft_us"])


def test_a_folder_without_requests_names_the_folder_and_file(tmp_path: Path) -> None:
    (tmp_path / "events.csv").write_text("timestamp_us,sequence,event_type,request_id\n")
    with pytest.raises(FileNotFoundError) as excinfo:
        plots.plot_results(tmp_path, None)
    message = str(excinfo.value)
    assert str(tmp_path) in message
    assert "requests.csv" in message and "requests.parquet" in message
    assert list(tmp_path.iterdir()) == [tmp_path / "events.csv"]  # nothing written


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        plots.plot_results(missing, None)
    assert not missing.exists()


def test_a_missing_optional_table_is_named_in_the_folders_format(small_results: Path) -> None:
    results = read_run_folder(small_results)
    fmt = small_results.name.removeprefix("results-")
    assert results.format == fmt
    assert results.has("events") and not results.has("iterations")
    with pytest.raises(FileNotFoundError, match=f"iterations\\.{fmt}") as excinfo:
        results.table("iterations")
    assert str(small_results) in str(excinfo.value)


def test_a_simulated_folder_is_not_measured(small_results: Path) -> None:
    assert not read_run_folder(small_results).measured


def test_the_manifest_says_which_format_is_the_runs(small_results: Path) -> None:
    fmt = small_results.name.removeprefix("results-")
    other = "csv" if fmt == "parquet" else "parquet"
    # A stray file of the other format, even a newer one, does not change what is read.
    frame = requests_frame([Request(0, 5, 1, 1)])
    (frame.to_csv if other == "csv" else frame.to_parquet)(
        small_results / f"requests.{other}", index=False
    )
    folder = read_run_folder(small_results)
    assert folder.format == fmt
    assert len(folder.requests()) > 1
    assert folder.manifest["tables"] == ["requests", "events", "admissions", "summary"]


def test_a_folder_without_manifest_is_read_from_its_one_format(tmp_path: Path) -> None:
    frame = requests_frame([Request(0, 5, 1, 1)])
    frame.to_csv(tmp_path / "requests.csv", index=False)
    assert read_run_folder(tmp_path).format == "csv"
    assert read_run_folder(tmp_path).requests()["arrival_time_us"].tolist() == [5]
    frame.to_parquet(tmp_path / "requests.parquet", index=False)
    with pytest.raises(ValueError, match=r"both requests\.csv and requests\.parquet"):
        read_run_folder(tmp_path)


# ---------------------------------------------------------------------- timeline series


def worked_example_frame(backend: simsim.SimulatedBackend) -> pd.DataFrame:
    """The worked timeline of docs/semantics.md, driven exactly as described there."""
    engine = simsim.SimulationEngine(backend)
    for rid, arrival, prompt, output in (
        (0, 0, 10, 2),
        (2, 50, 5, 1),
        (1, 50, 0, 0),
        (3, 60, 20, 3),
    ):
        engine.submit(Request(rid, arrival, prompt, output))
    while (now := engine.run_next_timestamp()) is not None:
        if now == 240:
            engine.cancel_request(2)
    return engine.requests_frame()


def test_occupancy_series_of_the_worked_example(backend: simsim.SimulatedBackend) -> None:
    frame = worked_example_frame(backend)
    # The table of docs/semantics.md: admit 0/140/240/240, finish 140/240/240/410.
    assert frame["admit_time_us"].tolist() == [0, 140, 240, 240]
    assert frame["finish_time_us"].tolist() == [140, 240, 240, 410]
    series = simsim.results.occupancy_series(frame)
    assert list(series.columns) == ["time_us", "queue_length", "occupancy"]
    assert all(dtype == np.dtype("int64") for dtype in series.dtypes)
    # 0 admitted at once; 1 and 2 queue at 50, 3 at 60; 1 admitted at 140 as 0 leaves;
    # at 240, 1 finishes, 2 is admitted and cancelled (no trace), 3 is admitted.
    assert series.to_numpy().tolist() == [
        [0, 0, 1],
        [50, 2, 1],
        [60, 3, 1],
        [140, 2, 1],
        [240, 0, 1],
        [410, 0, 0],
    ]


def hand_frame(rows: list[tuple[int, int, int | None, int | None]]) -> pd.DataFrame:
    """A requests-like table from (id, arrival, admit, finish); missing times are <NA>."""
    return pd.DataFrame(
        {
            "request_id": pd.array([r[0] for r in rows], dtype="int64"),
            "arrival_time_us": pd.array([r[1] for r in rows], dtype="Int64"),
            "admit_time_us": pd.array([r[2] for r in rows], dtype="Int64"),
            "finish_time_us": pd.array([r[3] for r in rows], dtype="Int64"),
        }
    )


def test_occupancy_series_cancellations_and_unfinished_requests() -> None:
    frame = hand_frame(
        [
            (0, 100, 100, 400),  # admitted on arrival, done at 400
            (1, 150, None, 300),  # cancelled while queued at 300
            (2, 500, None, 200),  # cancelled at 200, before it arrived: never queued
            (3, 200, 400, None),  # queued 200..400, then still active at the end
            (4, 250, None, None),  # still queued at the end
        ]
    )
    series = simsim.results.occupancy_series(frame)
    assert series.to_numpy().tolist() == [
        [0, 0, 0],
        [100, 0, 1],
        [150, 1, 1],
        [200, 2, 1],
        [250, 3, 1],
        [300, 2, 1],
        [400, 1, 1],  # 0 leaves and 3 enters at the same microsecond
    ]


def test_occupancy_series_of_no_requests_is_one_zero_row() -> None:
    assert simsim.results.occupancy_series(hand_frame([])).to_numpy().tolist() == [[0, 0, 0]]


def test_occupancy_series_agrees_with_the_event_log(small_results: Path) -> None:
    """Occupancy rises only at admissions recorded in the admissions table."""
    requests = read_run_folder(small_results).requests()
    admissions = read_run_folder(small_results).table("admissions")
    series = simsim.results.occupancy_series(requests)
    rises = series["time_us"][series["occupancy"].diff().fillna(series["occupancy"]) > 0]
    assert set(rises.tolist()) <= set(admissions["timestamp_us"].astype(int).tolist())
    assert series["occupancy"].max() == 1  # one slot
    assert series.iloc[-1].tolist()[1:] == [0, 0]  # everything done at the end


# ---------------------------------------------------------------------- figure content


def test_latency_cdf_plots_the_sorted_present_values_in_ms(small_results: Path) -> None:
    requests = read_run_folder(small_results).requests()
    fig = plots.draw_latency_cdf(requests)
    try:
        for ax, column in zip(fig.axes, ("ttft_us", "e2e_latency_us"), strict=True):
            present = np.sort(requests[column].dropna().to_numpy(dtype=float)) / 1000
            line = ax.lines[0]
            x = np.asarray(line.get_xdata(), dtype=float)
            y = np.asarray(line.get_ydata(), dtype=float)
            assert x[1:].tolist() == present.tolist()
            assert y[0] == 0 and y[-1] == 1 and np.all(np.diff(y) > 0)
            assert "(ms" in ax.get_xlabel()
            assert ax.get_legend() is not None
        assert "simulated" in fig.get_suptitle()
    finally:
        plt.close(fig)


def test_gantt_has_a_row_per_request_and_marks_cancellations(small_results: Path) -> None:
    requests = read_run_folder(small_results).requests()
    fig = plots.draw_gantt(requests)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == [str(i) for i in sorted(requests["request_id"])]
        (marks,) = ax.collections[-1:]
        offsets = np.asarray(marks.get_offsets()).tolist()
        rows = {rid: row for row, rid in enumerate(sorted(requests["request_id"]))}
        # Cancelled at 350 (queued), 500 (before arrival) and 2250 (decoding); x in ms.
        assert offsets == [[0.35, rows[4]], [0.5, rows[5]], [2.25, rows[6]]]
        assert ax.get_xlabel() == "simulated time (ms)"
        assert "simulated" in ax.get_title()
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------- the CLI


def test_cli_plot_prints_the_written_paths(
    small_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert cli.main(["plot", str(small_results), "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(tmp_path / n) for n in ("latency_cdf.png", "timeline.png", "gantt.png")]
    for line in lines:
        assert_png(Path(line))


def test_cli_plot_without_matplotlib_says_how_to_install_it(
    small_results: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "simsim.plots")
    # `from simsim import plots` would reuse the package attribute without importing.
    monkeypatch.delattr(simsim, "plots")
    before = sorted(small_results.iterdir())
    assert cli.main(["plot", str(small_results)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'simsim[plot]'" in err
    assert "matplotlib" in err
    assert sorted(small_results.iterdir()) == before


# ---------------------------------------------------------------------- iterations


def _iterations(count: int) -> pd.DataFrame:
    """*count* back-to-back 10 us iterations (5 prefill + 3 decode tokens); every 7th abandoned."""
    starts = np.arange(count, dtype=np.int64) * 10
    return pd.DataFrame(
        {
            "start_us": pd.array(starts, dtype="Int64"),
            "end_us": pd.array(starts + 10, dtype="Int64"),
            "prefill_tokens": 5,
            "prefilling_count": 1,
            "decoding_count": 3,
            "abandoned": np.arange(count) % 7 == 6,
            "batch_size": 4,
            "kv_blocks_in_use": 9,
        }
    )


def test_iterations_token_panel_bins_thousands_of_iterations() -> None:
    count = 7000
    frame = _iterations(count)
    fig = plots.draw_iterations(frame)
    try:
        tokens = fig.axes[2]
        bars = tokens.patches
        # Two stacked bars (prefill, decode) per window instead of 7,000 steps.
        assert len(bars) == 2 * plots.ITERATION_WINDOWS
        window_s = count * 10 / plots.ITERATION_WINDOWS / 1e6
        processed = int((~frame["abandoned"]).sum()) * (5 + 3)
        assert sum(bar.get_height() for bar in bars) * window_s == pytest.approx(processed)
        assert tokens.get_ylabel().startswith("tokens / s")
        assert tokens.get_xlabel() == "simulated time (ms)"
    finally:
        plt.close(fig)


def test_iterations_token_panel_keeps_steps_for_a_few_iterations() -> None:
    fig = plots.draw_iterations(_iterations(plots.ITERATIONS_BIN_AFTER))
    try:
        tokens = fig.axes[2]
        assert not tokens.patches
        assert tokens.get_ylabel() == "tokens per iteration"
        assert tokens.get_xlabel() == "simulated time (ms)"
    finally:
        plt.close(fig)


def test_gantt_draws_requests_unfinished_at_the_end_up_to_the_run_s_end() -> None:
    """A served session stopped mid-request: its bars reach the recorded end time."""
    requests = simsim.results.requests_frame(
        [
            simsim.Request(0, 0, 4, 2, state=simsim.RequestState.FINISHED, generated_token_count=2,
                           admit_time_us=0, prefill_end_time_us=100, first_token_time_us=200,
                           finish_time_us=300),
            simsim.Request(1, 50, 4, 900, state=simsim.RequestState.DECODING,
                           generated_token_count=3, admit_time_us=300, prefill_end_time_us=400,
                           first_token_time_us=500),
        ]
    )  # fmt: skip
    figure = plots.draw_gantt(requests, end_us=10_000)
    ax = figure.axes[0]
    scale, _ = plots._time_unit(10_000)
    bar_ends = [
        path.get_extents().x1 for collection in ax.collections for path in collection.get_paths()
    ]
    assert ax.get_xlim()[1] == pytest.approx(10_000 / scale)
    assert max(bar_ends) == pytest.approx(10_000 / scale)  # the unfinished decoding bar
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "unfinished at the end" in labels
    plt.close(figure)


def test_a_measured_folder_is_drawn_as_measured(tmp_path: Path) -> None:
    """A replay's folder (no admission or prefill times) says "measured" on every figure,
    shows requests in flight, and draws send-to-first-token and decoding bars."""
    from simsim.run_folder import write_run_folder

    frame = requests_frame([])
    rows = pd.DataFrame(
        {
            "request_id": [0, 1],
            "state": ["FINISHED", "CANCELLED"],
            "arrival_time_us": [0, 1_000],
            "prompt_token_count": [10, 10],
            "max_output_tokens": [4, 4],
            "generated_token_count": [4, 1],
            "admit_time_us": [None, None],
            "prefill_end_time_us": [None, None],
            "first_token_time_us": [3_000, 5_000],
            "finish_time_us": [9_000, 6_000],
        }
    )
    rows["queue_delay_us"] = None
    rows["ttft_us"] = rows["first_token_time_us"] - rows["arrival_time_us"]
    rows["e2e_latency_us"] = [9_000, None]
    rows["tpot_us"] = [2_000.0, None]
    requests = rows.astype(frame.dtypes.to_dict())
    write_run_folder(tmp_path, {"requests": requests}, extra={"measured": {"url": "x"}})
    folder = read_run_folder(tmp_path)
    assert folder.measured
    gantt = plots.draw_gantt(folder.requests(), measured=True)
    ax = gantt.axes[0]
    assert plots.MEASURED_NOTE in ax.get_title()
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[:2] == ["sent to first token", "first token to the end"]
    assert "failed" in labels
    failed = plots.draw_gantt(folder.requests().assign(state="FAILED"), measured=True)
    markers = [c for c in failed.axes[0].collections if c.get_offsets().shape[0] == 2]
    assert markers, "both failed requests are marked"
    plt.close(failed)
    # Request 0: 0-3 ms to its first token, 3-9 ms decoding; no waiting bar.
    bars = [
        [tuple(path.get_extents().intervalx) for path in collection.get_paths()]
        for collection in ax.collections
        if collection.get_paths()
    ]
    assert any(len(bar) == 1 and bar[0] == pytest.approx((0.0, 3.0)) for bar in bars)
    timeline = plots.draw_timeline(folder.requests(), measured=True)
    assert len(timeline.axes) == 1
    assert "in flight" in timeline.axes[0].get_ylabel()
    plt.close("all")
    written = plots.plot_results(tmp_path)
    assert [path.name for path in written] == ["latency_cdf.png", "timeline.png", "gantt.png"]
