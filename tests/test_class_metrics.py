"""Per-class results: class_summary (and summarize(by=...)) per request class and per
tenant, SLO targets per class, and the fairness rows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import EASY_CONFIG

import simsim
from simsim import cli
from simsim.results import NO_CLASS, class_summary, requests_frame, summarize
from simsim.run_folder import read_run_folder, write_run_folder
from simsim.schedulers.fair import FairShareScheduler

COSTS = EASY_CONFIG  # prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds)


def _mixed_frame() -> pd.DataFrame:
    engine = simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), max_active_requests=2)
    for rid in range(24):
        engine.submit(
            simsim.Request(
                rid,
                arrival_time_us=1_500 * rid,
                prompt_token_count=20 + 7 * (rid % 5),
                max_output_tokens=1 + rid % 6,
                request_class=("chat", "batch", None)[rid % 3],
                tenant="acme" if rid % 4 else "zeta",
            )
        )
    engine.run()
    return engine.requests_frame()


def test_each_column_is_summarize_of_that_class_over_the_common_window() -> None:
    frame = _mixed_frame()
    table = class_summary(frame, percentiles=(50, 95))
    assert list(table.columns) == ["batch", "chat", NO_CLASS]
    assert table.columns.name == "request_class" and table.index.name == "metric"
    start = int(frame["arrival_time_us"].min())
    end = int(frame["finish_time_us"].max())
    for name in table.columns:
        mask = frame["request_class"].fillna(NO_CLASS) == name
        # the class's rows, over the whole run's window (no request lies outside it)
        expected = summarize(frame[mask], percentiles=(50, 95), warmup_us=start, until_us=end + 1)
        expected.loc["makespan_us", "value"] = end - start
        seconds = (end - start) / 1e6
        finished = float((frame[mask]["state"] == "FINISHED").sum())
        expected.loc["throughput_requests_per_s", "value"] = finished / seconds
        tokens = float(frame[mask]["generated_token_count"].sum())
        expected.loc["throughput_tokens_per_s", "value"] = tokens / seconds
        pd.testing.assert_series_equal(table[name], expected["value"], check_names=False)
    assert (table.dtypes == "float64").all()


def test_class_throughputs_add_up_to_the_runs() -> None:
    frame = _mixed_frame()
    table = class_summary(frame, warmup_us=5_000)
    whole = summarize(frame, warmup_us=5_000)["value"]
    for row in (
        "requests",
        "count_FINISHED",
        "throughput_requests_per_s",
        "throughput_tokens_per_s",
    ):
        assert table.loc[row].sum() == pytest.approx(whole[row])
    assert set(table.loc["makespan_us"]) == {whole["makespan_us"]}


def test_slo_targets_per_class_each_with_its_own() -> None:
    frame = _mixed_frame()
    loose, tight = 10**9, 1
    table = class_summary(frame, slo={"chat": {"ttft_us": loose}, "batch": (tight, None)})
    assert table.loc["slo_attainment", "chat"] == 1.0
    assert table.loc["slo_attainment", "batch"] == 0.0
    assert math.isnan(table.loc["slo_attainment", NO_CLASS])  # no target for it
    assert math.isnan(table.loc["goodput_requests_per_s", NO_CLASS])
    # the same rows in every column, in summarize's order
    plain = summarize(frame, ttft_slo_us=1)
    assert list(table.index) == list(plain.index)


def test_a_star_target_applies_to_every_class_not_named() -> None:
    frame = _mixed_frame()
    table = class_summary(frame, slo={"*": {"ttft_us": 1}, "chat": {"tpot_us": 10**9}})
    assert table.loc["slo_attainment", "chat"] == 1.0
    assert table.loc["slo_attainment", "batch"] == 0.0
    assert table.loc["slo_attainment", NO_CLASS] == 0.0
    flat = class_summary(frame, slo={"ttft_us": 1})
    assert (flat.loc["slo_attainment"] == 0.0).all()


def test_a_class_named_only_in_the_slo_gets_an_empty_column() -> None:
    table = class_summary(_mixed_frame(), slo={"chta": {"ttft_us": 5}})
    assert table.loc["requests", "chta"] == 0.0
    assert math.isnan(table.loc["slo_attainment", "chta"])


@pytest.mark.parametrize(
    ("slo", "error", "match"),
    [
        ({"chat": {"ttft": 5}}, ValueError, r"slo\['chat'\] has unknown keys \['ttft'\]"),
        ({"chat": 5}, TypeError, r"slo\['chat'\] must be a mapping"),
        ({"chat": {"ttft_us": -1}}, ValueError, "ttft_us"),
        ({"chat": {"tpot_us": "fast"}}, TypeError, "tpot_us"),
        ({"ttft_us": -3}, ValueError, "slo ttft_us"),
        ([("chat", 1)], TypeError, "slo must be a mapping"),
    ],
)
def test_bad_slo_targets_are_refused_naming_the_class(
    slo: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        class_summary(_mixed_frame(), slo=slo)  # type: ignore[arg-type]


def test_bad_arguments_are_refused() -> None:
    frame = _mixed_frame()
    with pytest.raises(ValueError, match="by must be 'request_class'"):
        class_summary(frame, by="priority")
    with pytest.raises(ValueError, match="missing columns"):
        class_summary(frame.drop(columns=["ttft_us"]))
    with pytest.raises(ValueError, match="prompt_weight"):
        class_summary(frame, by="tenant", prompt_weight=-1)
    with pytest.raises(ValueError, match="slots"):
        summarize(frame, by="tenant", slots=2)


def test_summarize_by_is_class_summary() -> None:
    frame = _mixed_frame()
    pd.testing.assert_frame_equal(
        summarize(frame, by="class", ttft_slo_us=20_000, percentiles=(99,)),
        class_summary(frame, slo={"*": (20_000, None)}, percentiles=(99,)),
    )
    pd.testing.assert_frame_equal(summarize(frame, by="tenant"), class_summary(frame, "tenant"))


def test_a_frame_without_metadata_is_one_class() -> None:
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS))
    for rid in range(5):
        engine.submit(simsim.Request(rid, 100 * rid, 10, 3))
    engine.run()
    frame = engine.requests_frame()
    table = class_summary(frame)
    assert list(table.columns) == [NO_CLASS]
    pd.testing.assert_series_equal(table[NO_CLASS], summarize(frame)["value"], check_names=False)


# --------------------------------------------------------------------------- fairness


def _tenant_frame() -> pd.DataFrame:
    # Hand-made finished requests: tenant, arrival, admit, first token, finish, prompt, tokens.
    rows = [
        ("a", 0, 0, 100, 190, 10, 10),  # tokens at 100, 110, ..., 190
        ("a", 0, 200, 300, 300, 5, 1),
        ("b", 0, 400, 500, 540, 20, 5),  # tokens at 500, 510, ..., 540
        ("c", 0, None, None, 700, 7, 0),  # cancelled while queued
    ]
    requests = []
    for rid, (tenant, arrival, admit, first, finish, prompt, tokens) in enumerate(rows):
        request = simsim.Request(rid, arrival, prompt, max(tokens, 3), tenant=tenant)
        request.admit_time_us = admit
        request.first_token_time_us = first
        request.prefill_end_time_us = first
        request.finish_time_us = finish
        request.generated_token_count = tokens
        request.state = (
            simsim.RequestState.CANCELLED if admit is None else simsim.RequestState.FINISHED
        )
        requests.append(request)
    return requests_frame(requests)


def test_fairness_rows_over_the_whole_run() -> None:
    table = class_summary(_tenant_frame(), by="tenant")
    assert list(table.columns) == ["a", "b", "c"]
    service = {"a": 10 + 5 + 2 * 11, "b": 20 + 2 * 5, "c": 0}
    assert dict(table.loc["service_tokens"]) == service
    assert dict(table.loc["demand_tokens"]) == {"a": 10 + 20 + 5 + 6, "b": 20 + 10, "c": 7 + 6}
    total = sum(service.values())
    assert dict(table.loc["service_share"]) == pytest.approx(
        {name: x / total for name, x in service.items()}
    )
    values = np.asarray(list(service.values()), dtype=float)
    jain = values.sum() ** 2 / (3 * (values**2).sum())
    assert table.loc["jain_fairness_index"].tolist() == pytest.approx([jain] * 3)
    assert list(table.index[-4:]) == [
        "service_tokens",
        "demand_tokens",
        "service_share",
        "jain_fairness_index",
    ]


def test_service_counts_only_what_was_served_in_the_window() -> None:
    # [150, 520): a's tokens at 150..190 (5 of them) and its second request (admitted
    # at 200, its token at 300); b's admission is at 400 and its tokens at 500, 510.
    table = class_summary(_tenant_frame(), by="tenant", warmup_us=0, until_us=520)
    late = class_summary(_tenant_frame(), by="tenant", warmup_us=150, until_us=520)
    assert dict(table.loc["service_tokens"])["b"] == 20 + 2 * 2
    assert dict(late.loc["service_tokens"]) == {"a": 2 * 5 + 5 + 2 * 1, "b": 20 + 2 * 2, "c": 0}
    # the window's arrivals are at 0: late's window has none, so no demand
    assert (late.loc["demand_tokens"] == 0).all()
    # c was queued (backlogged) all along and served nothing: it counts in Jain's index
    values = np.asarray([17.0, 24.0, 0.0])
    assert late.loc["jain_fairness_index", "a"] == pytest.approx(
        values.sum() ** 2 / (3 * (values**2).sum())
    )


def test_fair_share_is_fairer_than_fcfs_while_both_tenants_are_backlogged() -> None:
    def run(scheduler: simsim.Scheduler | None) -> pd.DataFrame:
        engine = simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS), scheduler, max_active_requests=2
        )
        for rid in range(60):
            # "early" sends its burst first; "late" just after: both stay backlogged.
            tenant, arrival = ("early", 0) if rid < 30 else ("late", 10)
            engine.submit(simsim.Request(rid, arrival, 32, 8, tenant=tenant))
        engine.run()
        return class_summary(engine.requests_frame(), by="tenant", until_us=3_000)

    fcfs, fair = run(None), run(FairShareScheduler())
    assert fcfs.loc["service_share", "early"] > 0.9
    assert fair.loc["service_share", "early"] == pytest.approx(0.5, abs=0.1)
    assert fair.loc["jain_fairness_index", "early"] > 0.95
    assert fcfs.loc["jain_fairness_index", "early"] < 0.6


# --------------------------------------------------------------------------- plots


def _class_figures(folder: Path) -> dict[str, bool]:
    """Which of the per-class figures plot_results would draw for *folder*."""
    plots = pytest.importorskip("simsim.plots")
    import matplotlib.pyplot as plt

    results = read_run_folder(folder)
    drawn = {}
    for spec in plots.FIGURES:
        if spec.filename in ("class_latency.png", "tenant_latency.png"):
            fig = spec.draw(results)
            drawn[spec.filename] = fig is not None
            if fig is not None:
                plt.close(fig)
    return drawn


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_folder_that_names_classes_gets_the_per_class_figures(tmp_path: Path, fmt: str) -> None:
    write_run_folder(tmp_path, {"requests": _mixed_frame()}, format=fmt)  # type: ignore[arg-type]
    assert _class_figures(tmp_path) == {"class_latency.png": True, "tenant_latency.png": True}


def test_a_folder_without_classes_gets_none(tmp_path: Path) -> None:
    frame = _mixed_frame().drop(columns=["request_class"])
    write_run_folder(tmp_path, {"requests": frame})
    assert _class_figures(tmp_path) == {"class_latency.png": False, "tenant_latency.png": True}
    frame = frame.drop(columns=["tenant", "priority", "deadline_us"])
    write_run_folder(tmp_path, {"requests": frame})
    assert _class_figures(tmp_path) == {"class_latency.png": False, "tenant_latency.png": False}
    # a column present but empty (every request without a class) draws nothing either
    frame["tenant"] = pd.array([None] * len(frame), dtype="string")
    write_run_folder(tmp_path, {"requests": frame})
    assert _class_figures(tmp_path)["tenant_latency.png"] is False


def test_simsim_plot_writes_the_per_class_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("simsim.plots")
    frame = _mixed_frame().drop(columns=["tenant"])
    write_run_folder(tmp_path, {"requests": frame})
    assert cli.main(["plot", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[-1] == str(tmp_path / "class_latency.png")
    assert (tmp_path / "class_latency.png").read_bytes()[:4] == b"\x89PNG"


def test_class_latency_lines_are_each_class_s_sorted_values() -> None:
    plots = pytest.importorskip("simsim.plots")
    import matplotlib.pyplot as plt

    frame = _mixed_frame()
    fig = plots.draw_class_latency(frame)
    try:
        ttft, e2e = fig.axes[0], fig.axes[1]
        labels = [line.get_label() for line in ttft.get_lines()]
        assert [label.split(" (")[0] for label in labels] == ["batch", "chat", NO_CLASS]
        chat = frame[frame["request_class"] == "chat"]
        expected = np.sort(chat["e2e_latency_us"].to_numpy(dtype=float)) / 1000.0
        np.testing.assert_allclose(e2e.get_lines()[1].get_xdata()[1:], expected)
    finally:
        plt.close(fig)


def test_many_classes_keep_the_largest_and_share_one_line() -> None:
    plots = pytest.importorskip("simsim.plots")
    import matplotlib.pyplot as plt

    frame = _mixed_frame()
    frame["request_class"] = pd.array(
        [f"c{rid % 14}" if rid % 14 else "big" for rid in range(len(frame))], dtype="string"
    )
    frame.loc[frame.index[:5], "request_class"] = "big"
    fig = plots.draw_class_latency(frame)
    try:
        labels = [line.get_label() for line in fig.axes[1].get_lines()]
        assert len(labels) == plots.CLASS_LINES
        assert labels[0].startswith("big (")
        rest = frame["request_class"].nunique() - (plots.CLASS_LINES - 1)
        assert labels[-1].startswith(f"{rest} other classes (")
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="by must be one of"):
        plots.draw_class_latency(frame, by="priority")


def test_the_guides_slo_targets_example_prints_what_it_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # docs/classes.md, "Targets you already gave": the block runs and prints its output block
    page = (Path(__file__).resolve().parent.parent / "docs" / "classes.md").read_text("utf-8")
    section = page.split("**Targets you already gave.**", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/classes.md", "exec"), {})
    assert capsys.readouterr().out == shown
