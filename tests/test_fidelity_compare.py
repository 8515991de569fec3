"""simsim.fidelity.compare: per-request and percentile errors between two runs.

Synthetic request tables with known answers (B 10% slower everywhere, a constant
offset, every kind of excluded request), properties that hold for any two tables
(a run compared with itself, swapping the sides, agreement with ``summarize``), and
``simsim compare`` on folders written by ``simsim run``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import examples
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import simsim
from simsim import Request, RequestState, cli
from simsim.fidelity.compare import METRICS, OUTPUT_FILES, Comparison, compare_runs
from simsim.results import REQUEST_COLUMNS, requests_frame, summarize
from simsim.run_folder import read_run_folder, write_run_folder

FINISHED, CANCELLED = RequestState.FINISHED, RequestState.CANCELLED
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# (request_id, arrival, ttft, decode span, tokens): every latency a multiple of 10 us,
# so scaling them by 1.1 stays in integers.
BASE = [
    (0, 0, 1_000, 4_000, 5),
    (1, 500, 2_000, 900, 4),
    (2, 800, 300, 20_000, 11),
    (3, 2_000, 7_000, 1_000, 2),
    (4, 2_500, 50_000, 9_000, 10),
]


def request(
    request_id: int,
    arrival_us: int,
    ttft_us: int | None,
    decode_us: int | None,
    tokens: int,
    state: RequestState = FINISHED,
) -> Request:
    """A request as an engine leaves it: first token after *ttft_us*, end *decode_us* later."""
    first = None if ttft_us is None else arrival_us + ttft_us
    finish = None if decode_us is None else (first if first is not None else arrival_us) + decode_us
    return Request(
        request_id,
        arrival_us,
        10,
        max(tokens, 1),
        state=state,
        generated_token_count=tokens,
        first_token_time_us=first,
        finish_time_us=finish,
    )


def frame(rows: Sequence[tuple[int, int, int, int, int]], scale: float = 1.0) -> pd.DataFrame:
    """Finished requests from (id, arrival, ttft, decode span, tokens), latencies scaled."""
    return requests_frame(
        request(rid, arrival, round(ttft * scale), round(decode * scale), tokens)
        for rid, arrival, ttft, decode, tokens in rows
    )


def test_b_ten_percent_slower_everywhere_gives_ten_percent_everywhere() -> None:
    comparison = compare_runs(frame(BASE), frame(BASE, scale=1.1))
    assert comparison.request_counts == {
        "a": 5,
        "b": 5,
        "matched": 5,
        "only_a": 0,
        "only_b": 0,
        "different_sizes": 0,
    }
    assert comparison.errors["used"].tolist() == [5, 5, 5]
    for column in ("median_ape", "p90_ape"):
        assert comparison.errors[column].tolist() == pytest.approx([0.1] * 3, rel=1e-12)
    for metric in METRICS:
        ape = comparison.per_request[f"{metric.removesuffix('_us')}_ape"]
        assert ape.tolist() == pytest.approx([0.1] * 5, rel=1e-12)
    assert comparison.percentiles["signed_error"].tolist() == pytest.approx([0.1] * 9, rel=1e-12)
    assert comparison.percentiles["percentile"].tolist() == ["p50", "p90", "p99"] * 3


def test_a_constant_offset_in_the_first_token_shows_in_ttft_and_e2e_only() -> None:
    offset = 1_000
    shifted = requests_frame(
        request(rid, arrival, ttft + offset, decode, tokens)
        for rid, arrival, ttft, decode, tokens in BASE
    )
    comparison = compare_runs(frame(BASE), shifted)
    rows = comparison.per_request
    ttft = np.array([ttft for _, _, ttft, _, _ in BASE], dtype=float)
    e2e = np.array([ttft + decode for _, _, ttft, decode, _ in BASE], dtype=float)
    assert rows["ttft_ape"].tolist() == pytest.approx((offset / ttft).tolist())
    assert rows["e2e_latency_ape"].tolist() == pytest.approx((offset / e2e).tolist())
    assert rows["tpot_ape"].tolist() == [0.0] * 5
    errors = comparison.errors
    assert errors.loc["ttft_us", "median_ape"] == pytest.approx(float(np.median(offset / ttft)))
    assert errors.loc["ttft_us", "p90_ape"] == pytest.approx(float(np.quantile(offset / ttft, 0.9)))
    # Percentiles move with a shift: B's are A's plus the offset (TPOT unchanged).
    table = comparison.percentiles.set_index(["metric", "percentile"])
    difference = table["b_us"] - table["a_us"]
    assert difference.loc["ttft_us"].tolist() == pytest.approx([offset] * 3)
    assert difference.loc["e2e_latency_us"].tolist() == pytest.approx([offset] * 3)
    assert difference.loc["tpot_us"].tolist() == [0.0] * 3


def test_every_excluded_request_is_counted_by_its_reason() -> None:
    a = requests_frame(
        [
            request(0, 0, 100, 400, 5),  # counts everywhere
            request(1, 0, 100, 50, 3, CANCELLED),  # TTFT only: cancelled after a token
            request(2, 0, None, 70, 0, CANCELLED),  # nothing: cancelled before a token
            request(3, 0, 200, 0, 1),  # TTFT and E2E: one token, no TPOT
            request(4, 10, 0, 300, 4),  # TTFT 0 in the reference: excluded for TTFT
            request(5, 0, 100, 400, 5),  # only in A
        ]
    )
    b = requests_frame(
        [
            request(0, 0, 110, 440, 5),
            request(1, 0, 120, 500, 3),  # finished in B, cancelled in A
            request(2, 0, 90, 50, 2),
            request(3, 0, 220, 0, 1),
            request(4, 10, 30, 330, 4),
            request(6, 0, 100, 400, 5),  # only in B
        ]
    )
    comparison = compare_runs(a, b)
    assert comparison.request_counts == {
        "a": 6,
        "b": 6,
        "matched": 5,
        "only_a": 1,
        "only_b": 1,
        "different_sizes": 1,  # request 2's output limit: 0 in A, 2 in B
    }
    errors = comparison.errors
    assert errors.loc["ttft_us"].to_dict() == pytest.approx(
        {
            "label": "TTFT",
            "used": 3,  # 0, 1, 3
            "excluded_unmatched": 2,  # 5, 6
            "excluded_missing": 1,  # 2 (no first token in A)
            "excluded_zero_reference": 1,  # 4
            "median_ape": 0.1,
            "p90_ape": pytest.approx(0.18),  # 0.1, 0.1, 0.2: between the two highest
        }
    )
    assert errors.loc["e2e_latency_us", ["used", "excluded_missing"]].tolist() == [3, 2]
    assert errors.loc["tpot_us", ["used", "excluded_missing"]].tolist() == [2, 3]
    total = len(set(a["request_id"]) | set(b["request_id"]))
    excluded = errors[["excluded_unmatched", "excluded_missing", "excluded_zero_reference"]]
    assert (errors["used"] + excluded.sum(axis=1)).tolist() == [total] * 3
    # Unmatched requests are rows too, with the other side empty and no error.
    only = comparison.per_request.set_index("request_id").loc[[5, 6]]
    assert only["a_state"].isna().tolist() == [False, True]
    assert only["b_state"].isna().tolist() == [True, False]
    assert only["ttft_ape"].isna().all()
    # Each side's percentiles cover its own requests: A's TTFT over 0, 1, 3, 4 and 5.
    ttft = comparison.percentiles.set_index(["metric", "percentile"]).loc["ttft_us"]
    assert ttft["a_count"].tolist() == [5] * 3
    assert ttft.loc["p50", "a_us"] == 100.0
    text = comparison.table()
    assert "1 missing on a side, 1 A = 0, 2 unmatched" in text
    assert "matched by request_id: 5 (1 only in A, 1 only in B)" in text


def test_a_zero_reference_percentile_has_no_signed_error() -> None:
    zero = requests_frame([request(0, 0, 0, 100, 2), request(1, 0, 0, 100, 2)])
    other = requests_frame([request(0, 0, 50, 100, 2), request(1, 0, 70, 100, 2)])
    comparison = compare_runs(zero, other)
    ttft = comparison.percentiles[comparison.percentiles["metric"] == "ttft_us"]
    assert ttft["signed_error"].isna().all()
    assert comparison.errors.loc["ttft_us", "used"] == 0
    assert math.isnan(comparison.errors.loc["ttft_us", "median_ape"])
    summary = comparison.to_dict()
    assert summary["per_request_error"]["ttft_us"]["median_ape"] is None
    assert summary["percentiles"]["ttft_us"]["p50"]["signed_error"] is None
    json.dumps(summary, allow_nan=False)  # no NaN reaches the JSON
    assert "no request has a TTFT in both" in comparison.table()


def test_the_table_shows_milliseconds_and_percentages() -> None:
    comparison = compare_runs(frame(BASE), frame(BASE, scale=1.1), labels=("server", "model"))
    text = str(comparison)
    assert text.startswith("A (reference): server, 5 requests\nB:             model, 5 requests")
    # TTFT p50 of A is 2,000 us = 2.00 ms; B's is 2.20 ms.
    assert "TTFT p50            2.00        2.20        +10.0%" in text
    assert "E2E         10.0%    10.0%       5   none" in text


def test_custom_percentiles_name_their_rows() -> None:
    comparison = compare_runs(frame(BASE), frame(BASE), percentiles=(25, 99.9))
    assert comparison.percentiles["percentile"].tolist() == ["p25", "p99.9"] * 3
    assert set(comparison.to_dict()["percentiles"]["tpot_us"]) == {"p25", "p99.9"}


# ---------------------------------------------------------------------- properties


@st.composite
def requests_tables(draw: st.DrawFn, ids: Sequence[int] | None = None) -> pd.DataFrame:
    """A requests table of finished and cancelled requests with latencies from 0 to 1 s."""
    chosen = ids if ids is not None else draw(st.sets(st.integers(0, 30), min_size=1))
    rows = []
    for rid in sorted(chosen):
        tokens = draw(st.integers(0, 6))
        state = draw(st.sampled_from([FINISHED, CANCELLED]))
        ttft = draw(st.integers(0, 1_000_000)) if tokens else None
        decode = draw(st.integers(0, 1_000_000))
        rows.append(request(rid, draw(st.integers(0, 10**6)), ttft, decode, tokens, state))
    return requests_frame(rows)


@settings(max_examples=examples(40), deadline=None)
@given(requests_tables())
def test_a_run_compared_with_itself_has_no_error(table: pd.DataFrame) -> None:
    comparison = compare_runs(table, table)
    assert comparison.request_counts["only_a"] == comparison.request_counts["only_b"] == 0
    for metric in METRICS:
        ape = comparison.per_request[f"{metric.removesuffix('_us')}_ape"].dropna()
        assert (ape == 0).all()
        has = table[metric].notna()
        positive = int((table.loc[has, metric] > 0).sum())
        assert comparison.errors.loc[metric, "used"] == positive
        assert comparison.errors.loc[metric, "excluded_zero_reference"] == int(has.sum()) - positive
    signed = comparison.percentiles["signed_error"].dropna()
    assert (signed == 0).all()
    assert (
        comparison.percentiles["a_us"].fillna(-1) == comparison.percentiles["b_us"].fillna(-1)
    ).all()


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_swapping_the_runs_swaps_the_sides(data: st.DataObject) -> None:
    ids = data.draw(st.sets(st.integers(0, 20), min_size=1))
    extra = data.draw(st.sets(st.integers(0, 20)))
    a = data.draw(requests_tables(sorted(ids)))
    b = data.draw(requests_tables(sorted(ids ^ extra) or sorted(ids)))
    assume(bool(set(a["request_id"]) & set(b["request_id"])))  # else refused: tested below
    ab, ba = compare_runs(a, b), compare_runs(b, a)
    assert ab.request_counts["only_a"] == ba.request_counts["only_b"]
    # Which requests have a metric on both sides does not depend on the order.
    both_ab = ab.errors["used"] + ab.errors["excluded_zero_reference"]
    both_ba = ba.errors["used"] + ba.errors["excluded_zero_reference"]
    assert both_ab.tolist() == both_ba.tolist()
    assert ab.errors["excluded_missing"].tolist() == ba.errors["excluded_missing"].tolist()
    # The percentiles change sides; where both are positive, (1 + s_ab)(1 + s_ba) = 1.
    assert ab.percentiles["a_us"].equals(ba.percentiles["b_us"])
    product = (1 + ab.percentiles["signed_error"]) * (1 + ba.percentiles["signed_error"])
    assert product.dropna().tolist() == pytest.approx([1.0] * len(product.dropna()))
    # Per request |B - A| is the same both ways: ape_ab * A == ape_ba * B.
    for metric in METRICS:
        stem = metric.removesuffix("_us")
        rows_ab = ab.per_request.set_index("request_id")
        rows_ba = ba.per_request.set_index("request_id")
        both = rows_ab[f"{stem}_ape"].notna() & rows_ba[f"{stem}_ape"].notna()
        left = (rows_ab[f"{stem}_ape"] * rows_ab[f"a_{metric}"])[both]
        right = (rows_ba[f"{stem}_ape"] * rows_ba[f"a_{metric}"])[both]
        assert left.tolist() == pytest.approx(right.tolist())


@settings(max_examples=examples(25), deadline=None)
@given(requests_tables(), requests_tables())
def test_each_sides_percentiles_are_its_summary(a: pd.DataFrame, b: pd.DataFrame) -> None:
    b = b.assign(request_id=b["request_id"] + 100)
    b = pd.concat([b, a.iloc[:1]], ignore_index=True)  # one shared id: comparable
    comparison = compare_runs(a, b)
    rows = comparison.percentiles
    for side, table in (("a", a), ("b", b)):
        summary = summarize(table)["value"]
        for row in rows.to_dict("records"):
            expected = summary[f"{row['metric']}_{row['percentile']}"]
            got = row[f"{side}_us"]
            assert (math.isnan(expected) and math.isnan(got)) or got == pytest.approx(expected)


# ---------------------------------------------------------------------- bad input


def test_a_table_without_a_column_names_the_side_and_the_columns() -> None:
    table = frame(BASE)
    with pytest.raises(
        ValueError, match=r"B: the requests DataFrame lacks the columns \['ttft_us'\]"
    ):
        compare_runs(table, table.drop(columns="ttft_us"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.iloc[:0], "A: the requests DataFrame holds no requests"),
        (lambda t: pd.concat([t, t.iloc[:1]]), "A: the requests DataFrame repeats request_id 0"),
        (
            lambda t: t.assign(ttft_us=t["ttft_us"] - 10_000),
            "A: the requests DataFrame: request 0 has ttft_us = -9000",
        ),
        (
            lambda t: t.assign(request_id=t["request_id"] + 50),
            r"A and B share no request_id.*A's ids 50..54, B's 0..4",
        ),
    ],
)
def test_bad_tables_are_refused_with_the_rule(change: object, message: str) -> None:
    table = frame(BASE)
    with pytest.raises(ValueError, match=message):
        compare_runs(change(table), table)  # type: ignore[operator]


def test_bad_labels_and_percentiles_are_refused() -> None:
    table = frame(BASE)
    with pytest.raises(ValueError, match="labels must differ"):
        compare_runs(table, table, labels=("x", "x"))
    with pytest.raises(ValueError, match="labels must be two non-empty strings"):
        compare_runs(table, table, labels=("x", ""))
    with pytest.raises(ValueError, match="strictly between 0 and 100, got 100"):
        compare_runs(table, table, percentiles=(50, 100))
    with pytest.raises(TypeError, match=r"B: expected a results folder.*got int"):
        compare_runs(table, 3)  # type: ignore[arg-type]


def test_a_folder_that_is_not_a_run_is_named_with_its_side(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"B \(nothing\): results folder .*nothing"):
        compare_runs(frame(BASE), tmp_path / "nothing")


# ---------------------------------------------------------------------- folders and the CLI

SCENARIO = """
[scenario]
name = "{name}"
seed = 1
[backend]
prefill_base_us = 1000
prefill_per_token_us = 20
prefill_per_active_sequence_us = 0
decode_base_us = {decode}
decode_per_active_sequence_us = 0
[workload]
count = 30
rate_per_s = 50.0
prompt_tokens = [10, 200]
output_tokens = [1, 30]
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Folders written by ``simsim run`` of one workload on two cost models."""
    root = tmp_path_factory.mktemp("runs")
    folders = []
    for name, decode in (("fast", 500), ("slow", 600)):
        scenario = root / f"{name}.toml"
        scenario.write_text(SCENARIO.format(name=name, decode=decode))
        assert cli.main(["run", str(scenario), "--out", str(root / name)]) == 0
        folders.append(root / name)
    return folders[0], folders[1]


def test_a_folder_a_run_folder_and_a_frame_give_the_same_comparison(
    two_runs: tuple[Path, Path],
) -> None:
    fast, slow = two_runs
    by_path = compare_runs(fast, str(slow))
    by_folder = compare_runs(read_run_folder(fast), read_run_folder(slow))
    frames = compare_runs(read_run_folder(fast).requests(), read_run_folder(slow).requests())
    assert by_path.labels == by_folder.labels == ("fast", "slow")
    assert frames.labels == ("A", "B")
    for other in (by_folder, frames):
        pd.testing.assert_frame_equal(by_path.per_request, other.per_request)
        pd.testing.assert_frame_equal(by_path.errors, other.errors)
        pd.testing.assert_frame_equal(by_path.percentiles, other.percentiles)
    # Every decode step is 20% longer in B; TPOT is all decode steps.
    assert by_path.errors.loc["tpot_us", "median_ape"] == pytest.approx(0.2)


def test_a_measured_folder_with_appended_columns_and_no_admission_times(
    tmp_path: Path, two_runs: tuple[Path, Path]
) -> None:
    """What the replay writes: the request columns first, then its own, and <NA> admits."""
    fast, _ = two_runs
    simulated = read_run_folder(fast).requests()
    measured = simulated.assign(
        admit_time_us=pd.NA,
        prefill_end_time_us=pd.NA,
        queue_delay_us=pd.NA,
        scheduled_time_us=simulated["arrival_time_us"],
        send_lag_us=0,
    )
    write_run_folder(tmp_path, {"requests": measured}, scenario="replayed")
    comparison = compare_runs(tmp_path, fast)
    assert comparison.errors["median_ape"].tolist() == [0.0] * 3
    assert comparison.request_counts["matched"] == len(simulated)


def test_cli_compare_prints_the_table_and_writes_tables_json_and_figures(
    tmp_path: Path, two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fast, slow = two_runs
    out = tmp_path / "comparison"
    argv = ["compare", str(fast), str(slow), "--out", str(out), "--labels", "measured,model"]
    assert cli.main([*argv, "--percentiles", "50,95"]) == 0
    printed = capsys.readouterr().out
    comparison = compare_runs(fast, slow, labels=("measured", "model"), percentiles=(50, 95))
    assert printed.startswith(comparison.table() + "\n")
    assert "TPOT p95" in printed
    for name in OUTPUT_FILES.values():
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads((out / OUTPUT_FILES["summary"]).read_text()) == comparison.to_dict()
    errors = pd.read_csv(out / OUTPUT_FILES["errors"], index_col="metric")
    assert errors["used"].tolist() == comparison.errors["used"].tolist()
    per_request = pd.read_csv(out / OUTPUT_FILES["per_request"])
    assert per_request["request_id"].tolist() == comparison.per_request["request_id"].tolist()


def test_write_without_figures_needs_no_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    comparison = compare_runs(frame(BASE), frame(BASE, scale=1.1))
    _hide_matplotlib(monkeypatch)
    with pytest.raises(ImportError, match=r"need matplotlib.*pip install 'simsim\[plot\]'"):
        comparison.write(tmp_path / "with-figures")
    assert not (tmp_path / "with-figures").exists()
    written = comparison.write(tmp_path / "tables", figures=False)
    assert [path.name for path in written] == [
        OUTPUT_FILES[name] for name in ("per_request", "errors", "percentiles", "summary")
    ]


def _hide_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "simsim.plots", raising=False)
    # `from simsim import plots` would reuse the package attribute without importing.
    monkeypatch.delattr(simsim, "plots", raising=False)


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("simsim: error: ")
    return lines[0]


def test_cli_compare_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    two_runs: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, slow = two_runs
    line = one_line_error(capsys, "compare", str(fast), str(tmp_path / "missing"))
    assert "B (missing)" in line and "does not exist" in line
    other = tmp_path / "other"
    other.mkdir()
    shifted = read_run_folder(fast).requests()
    shifted = shifted.assign(request_id=shifted["request_id"] + 1_000)
    write_run_folder(other, {"requests": shifted})
    assert "share no request_id" in one_line_error(capsys, "compare", str(fast), str(other))
    line = one_line_error(capsys, "compare", str(fast), str(slow), "--labels", "one")
    assert "--labels" in line and "'one'" in line
    line = one_line_error(capsys, "compare", str(fast), str(slow), "--percentiles", "50,x")
    assert "--percentiles" in line and "'50,x'" in line
    _hide_matplotlib(monkeypatch)
    out = tmp_path / "figures"
    line = one_line_error(capsys, "compare", str(fast), str(slow), "--out", str(out))
    assert "matplotlib" in line and "pip install 'simsim[plot]'" in line
    assert not out.exists()


def test_comparison_is_frozen() -> None:
    comparison = compare_runs(frame(BASE), frame(BASE))
    assert isinstance(comparison, Comparison)
    with pytest.raises(AttributeError):
        comparison.labels = ("x", "y")  # type: ignore[misc]
    assert list(comparison.per_request.columns[:3]) == ["request_id", "a_state", "b_state"]
    assert set(REQUEST_COLUMNS) >= set(METRICS)


def test_runs_of_different_workloads_are_warned_about(
    tmp_path: Path, two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Matched ids with other prompt or output lengths: a warning, in the table and on
    stderr; a folder compared with itself: a warning too."""
    a = frame(BASE)
    b = a.assign(prompt_token_count=a["prompt_token_count"] + [0, 0, 1, 0, 7])
    comparison = compare_runs(a, b)
    assert comparison.request_counts["different_sizes"] == 2
    assert "WARNING: 2 matched requests differ in prompt or output length" in comparison.table()
    assert "WARNING" not in compare_runs(a, a).table()
    fast, _ = two_runs
    assert cli.main(["compare", str(fast), str(fast)]) == 0
    assert "A and B are the same folder" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    requests = read_run_folder(fast).requests()
    write_run_folder(other, {"requests": requests.assign(max_output_tokens=1)})
    assert cli.main(["compare", str(fast), str(other)]) == 0
    assert "not runs of the same workload" in capsys.readouterr().err
