"""Trace replay: Azure and plain CSV traces, exact microseconds, windows, scaling, errors."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from helpers import ROOT, load_script
from hypothesis import given
from hypothesis import strategies as st

import simsim
from simsim.traces import (
    SAMPLE_AZURE_TRACE,
    TraceError,
    TraceOverflowError,
    _round_half_even,
    read_azure_trace,
    read_plain_trace,
    read_table,
)

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def azure(tmp_path: Path, *rows: str) -> Path:
    return write(tmp_path, AZURE_HEADER + "".join(f"{row}\n" for row in rows))


def arrivals(requests: list[simsim.Request]) -> list[int]:
    return [r.arrival_time_us for r in requests]


def table(requests: list[simsim.Request]) -> list[tuple[int, int, int, int]]:
    return [
        (r.request_id, r.arrival_time_us, r.prompt_token_count, r.max_output_tokens)
        for r in requests
    ]


# ---------------------------------------------------------------------- Azure format


def test_azure_trace_maps_columns_and_exact_microseconds(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:47.0000000,396,109",
        "2023-11-16 18:15:48.1234567,879,0",
    )
    requests = read_azure_trace(path)
    assert table(requests) == [
        (0, 0, 374, 44),
        (1, 319_410, 396, 109),
        (2, 1_442_867, 879, 0),  # 1.4428667 s -> nearest microsecond
    ]
    # Values, not engine-owned objects: any number of engines can replay the same list.
    assert all(type(r) is simsim.RequestSpec for r in requests)
    assert all(type(r.arrival_time_us) is int for r in requests)


def test_azure_rounding_ties_go_to_even(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2024-01-01 00:00:00.0000000,1,1",
        "2024-01-01 00:00:00.0000005,2,1",  # 0.5 us -> 0
        "2024-01-01 00:00:00.0000015,3,1",  # 1.5 us -> 2
        "2024-01-01 00:00:00.0000025,4,1",  # 2.5 us -> 2
        "2024-01-01 00:00:00.0000035,5,1",  # 3.5 us -> 4
        "2024-01-01 00:00:00.00000250000001,6,1",  # just above a tie -> 3
    )
    by_prompt = {r.prompt_token_count: r.arrival_time_us for r in read_azure_trace(path)}
    assert by_prompt == {1: 0, 2: 0, 3: 2, 4: 2, 5: 4, 6: 3}


def test_azure_fractions_of_any_length_and_day_boundaries(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-12-31 23:59:59.9999990,1,1",
        "2024-01-01T00:00:00,1,1",  # no fraction, T separator, across a year boundary
        "2024-01-01 00:00:01.5,1,1",
        "2024-03-01 00:00:00.000001,1,1",  # 2024 is a leap year: 60 days later
    )
    assert arrivals(read_azure_trace(path)) == [
        0,
        1,
        1_500_001,
        60 * 86_400_000_000 + 2,
    ]


def test_azure_utc_offsets_are_honoured(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2024-05-10 00:00:00.000000+00:00,1,1",
        "2024-05-10 02:00:00.25+02:00,2,1",  # 00:00:00.25 UTC
        "2024-05-09T23:00:01Z,3,1",  # earlier than the first row
        "2024-05-09 19:30:02.5-0430,4,1",  # 2024-05-10 00:00:02.5 UTC
    )
    assert table(read_azure_trace(path)) == [
        (0, 0, 3, 1),
        (1, 3_599_000_000, 1, 1),
        (2, 3_599_250_000, 2, 1),
        (3, 3_601_500_000, 4, 1),
    ]


def test_azure_time_scale_divides_offsets_and_rounds_once(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:00:00.0000000,1,1",
        "2023-11-16 18:00:01.0000000,1,1",
        "2023-11-16 18:00:02.0000000,1,1",
        "2023-11-16 18:00:02.0000014,1,1",
    )
    assert arrivals(read_azure_trace(path, time_scale=3)) == [0, 333_333, 666_667, 666_667]
    assert arrivals(read_azure_trace(path, time_scale=0.5)) == [0, 2_000_000, 4_000_000, 4_000_003]
    # 2.0000014 s / 0.5 = 4.0000028 s -> 4_000_003 us, not 2 * round(2_000_001.4) = 4_000_002.
    assert arrivals(read_azure_trace(path, time_scale=1.5)) == [0, 666_667, 1_333_333, 1_333_334]


def test_azure_window_selects_by_trace_time_and_rebases_to_its_start(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:00:00.0,10,1",
        "2023-11-16 18:00:00.9999999,11,1",
        "2023-11-16 18:00:01.0,12,1",  # exactly at the window start: kept
        "2023-11-16 18:00:02.5,13,1",
        "2023-11-16 18:00:03.0,14,1",  # exactly at the window end: left out
        "2023-11-16 18:00:04.0,15,1",
    )
    window = read_azure_trace(path, window_start_s=1, window_duration_s=2, first_request_id=7)
    assert table(window) == [(7, 0, 12, 1), (8, 1_500_000, 13, 1)]
    scaled = read_azure_trace(path, window_start_s=1, window_duration_s=2, time_scale=2)
    assert arrivals(scaled) == [0, 750_000]
    # Arrivals count from the window's start, not from its first request.
    late = read_azure_trace(path, window_start_s=0.5)
    assert [r.prompt_token_count for r in late] == [11, 12, 13, 14, 15]
    assert arrivals(late)[:2] == [500_000, 500_000]
    tail = read_azure_trace(path, window_duration_s=1)
    assert [r.prompt_token_count for r in tail] == [10, 11]


def test_azure_unsorted_rows_are_sorted_stably(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:00:02.0,1,1",
        "2023-11-16 18:00:01.0,2,1",
        "2023-11-16 18:00:02.0,3,1",
        "2023-11-16 18:00:00.5,4,1",
        "2023-11-16 18:00:01.0,5,1",
    )
    requests = read_azure_trace(path)
    assert table(requests) == [
        (0, 0, 4, 1),
        (1, 500_000, 2, 1),
        (2, 500_000, 5, 1),
        (3, 1_500_000, 1, 1),
        (4, 1_500_000, 3, 1),
    ]


def test_extra_columns_are_ignored_in_both_formats(tmp_path: Path) -> None:
    # Real traces carry more columns (model, user, ...); only the known ones are read.
    plain = write(
        tmp_path,
        "user,arrival_time_us,prompt_token_count,max_output_tokens,priority,user2\n"
        "u,5,3,1,high,\nv,0,2,4,low,\n",
    )
    assert table(read_plain_trace(plain)) == [(0, 0, 2, 4), (1, 5, 3, 1)]
    extra = write(
        tmp_path, AZURE_HEADER.strip() + ",Model,Model\n2023-11-16 18:00:00,7,5,a,b\n", "a.csv"
    )
    assert table(read_azure_trace(extra)) == [(0, 0, 7, 5)]


def test_a_strict_table_still_refuses_other_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b\n1,2\n")
    with pytest.raises(TraceError, match=r"line 1: unknown columns \['b'\]"):
        read_table(path, ("a",), other_columns=False)


def test_a_misspelt_column_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, "TIMESTAMP,ContextToken,generatedtokens\n2023-11-16 18:00:00,1,1\n")
    message = (
        r"missing columns \['ContextTokens', 'GeneratedTokens'\] \(did you mean "
        r"'ContextToken' for 'ContextTokens', 'generatedtokens' for 'GeneratedTokens'\?\)"
    )
    with pytest.raises(TraceError, match=message):
        read_azure_trace(path)


def test_replay_past_64_bits_names_the_argument_at_fault(tmp_path: Path) -> None:
    path = write(tmp_path, "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,1\n1,1,1\n")
    with pytest.raises(TraceOverflowError) as info:
        read_plain_trace(path, first_request_id=2**63 - 1)
    assert info.value.argument == "first_request_id"
    assert isinstance(info.value, OverflowError)
    assert table(read_plain_trace(path, first_request_id=2**63 - 2))[-1][0] == 2**63 - 1
    big = write(
        tmp_path, "arrival_time_us,prompt_token_count,max_output_tokens\n" + f"{2**62},1,1\n", "b"
    )
    with pytest.raises(OverflowError, match=r"b: line 2: the scaled arrival time") as scaled:
        read_plain_trace(big, time_scale=0.25)
    assert isinstance(scaled.value, TraceOverflowError)
    assert scaled.value.argument == "time_scale"


def test_azure_accepts_any_column_order_blank_lines_and_a_bom(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "\ufeffGeneratedTokens, TIMESTAMP ,ContextTokens\r\n"
        "5,2023-11-16 18:00:00.25,7\r\n\r\n,,\r\n"
        "6, 2023-11-16 18:00:00.75 ,8\r\n",
    )
    assert table(read_azure_trace(path)) == [(0, 0, 7, 5), (1, 500_000, 8, 6)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", r"trace\.csv: line 1: the file is empty"),
        (AZURE_HEADER, "header but no rows"),
        (AZURE_HEADER + "\n\n", "header but no rows"),
        ("TIMESTAMP,ContextTokens\n", "missing columns \\['GeneratedTokens'\\]"),
        ("TIMESTAMP,TIMESTAMP,ContextTokens,GeneratedTokens\n", "'TIMESTAMP' appears twice"),
        (
            AZURE_HEADER + "2023-11-16 18:00:00,1,1\n2023-11-16 18:00:01,-3,1\n",
            "line 3, column ContextTokens: must be a non-negative integer, got negative '-3'",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:00:00,1,12.5\n",
            "line 2, column GeneratedTokens: .*'12.5' \\(not an integer\\)",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:00:00,1,1.0\n",
            "line 2, column GeneratedTokens: .*not an integer",
        ),
        (AZURE_HEADER + "2023-11-16 18:00:00,,1\n", "line 2, column ContextTokens: .*missing"),
        (
            AZURE_HEADER + "\n\n2023-11-16 18:00:00,1,x\n",
            "line 4, column GeneratedTokens",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:00:00,1,1\n11/16/2023 18:00:01,1,1\n",
            "line 3, column TIMESTAMP: cannot read the date-time '11/16/2023 18:00:01'",
        ),
        (
            AZURE_HEADER + "2023-02-30 18:00:00.5,1,1\n",
            "line 2, column TIMESTAMP: not a valid date-time",
        ),
        (AZURE_HEADER + "2023-11-16 24:00:00,1,1\n", "line 2, column TIMESTAMP: not a valid"),
        (AZURE_HEADER + "2023-11-16 18:00:00+25:00,1,1\n", "line 2, column TIMESTAMP: .*offset"),
        (AZURE_HEADER + "2023-11-16 18:00:00,1\n", "line 2: expected 3 fields, got 2"),
        (
            AZURE_HEADER + "2023-11-16 18:00:00,1,99999999999999999999\n",
            "line 2, column GeneratedTokens: .*64-bit",
        ),
    ],
)
def test_azure_errors_name_file_line_and_column(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(TraceError, match=message) as caught:
        read_azure_trace(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_trace_error_keeps_its_parts(tmp_path: Path) -> None:
    path = azure(tmp_path, "2023-11-16 18:00:00,1,1", "2023-11-16 18:00:00,-1,1")
    with pytest.raises(TraceError) as caught:
        read_azure_trace(path)
    error = caught.value
    assert (error.source, error.line, error.column) == (str(path), 3, "ContextTokens")
    assert "negative" in error.rule


def test_missing_file_and_empty_window_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the file"):
        read_azure_trace(tmp_path / "nowhere.csv")
    path = azure(tmp_path, "2023-11-16 18:00:00,1,1", "2023-11-16 18:00:05,1,1")
    with pytest.raises(TraceError, match=r"window \[10, end\) s .* selects none of the 2 rows"):
        read_azure_trace(path, window_start_s=10)
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_azure_trace(tmp_path / "binary.csv")


@pytest.mark.parametrize(
    ("keyword", "value", "error"),
    [
        ("time_scale", 0, ValueError),
        ("time_scale", -2.0, ValueError),
        ("time_scale", float("nan"), ValueError),
        ("time_scale", True, TypeError),
        ("time_scale", "2", TypeError),
        ("window_start_s", -1, ValueError),
        ("window_duration_s", 0, ValueError),
        ("window_duration_s", float("inf"), ValueError),
        ("first_request_id", -1, ValueError),
    ],
)
def test_azure_arguments_are_validated(
    tmp_path: Path, keyword: str, value: object, error: type[Exception]
) -> None:
    path = azure(tmp_path, "2023-11-16 18:00:00,1,1")
    with pytest.raises(error, match=keyword):
        read_azure_trace(path, **{keyword: value})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- plain format


def test_plain_trace_keeps_absolute_times_and_sorts_stably(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "arrival_time_us,prompt_token_count,max_output_tokens\n500,1,1\n100,2,2\n500,3,3\n0,4,4\n",
    )
    assert table(read_plain_trace(path, first_request_id=10)) == [
        (10, 0, 4, 4),
        (11, 100, 2, 2),
        (12, 500, 1, 1),
        (13, 500, 3, 3),
    ]


def test_plain_trace_request_ids_come_from_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "request_id,arrival_time_us,prompt_token_count,max_output_tokens\n"
        "10,5000,256,4\n11,5000,32,12\n3,90,700,2\n",
    )
    assert table(read_plain_trace(path)) == [
        (3, 90, 700, 2),
        (10, 5_000, 256, 4),
        (11, 5_000, 32, 12),
    ]
    duplicate = write(
        tmp_path,
        "request_id,arrival_time_us,prompt_token_count,max_output_tokens\n"
        "10,0,1,1\n11,0,1,1\n10,5,1,1\n",
        "dup.csv",
    )
    with pytest.raises(TraceError, match="line 4, column request_id: request id 10 appears twice"):
        read_plain_trace(duplicate)


def test_plain_trace_scaling_and_windows_are_exact(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,1\n3,1,1\n5,1,1\n10,1,1\n",
    )
    assert arrivals(read_plain_trace(path, time_scale=2)) == [0, 2, 2, 5]  # 1.5 -> 2, 2.5 -> 2
    assert arrivals(read_plain_trace(path, time_scale=Fraction(2, 3))) == [0, 4, 8, 15]
    windowed = read_plain_trace(path, window_start_us=3, window_duration_us=7)
    assert [(r.request_id, r.arrival_time_us) for r in windowed] == [(0, 0), (1, 2)]
    assert arrivals(read_plain_trace(path, window_start_us=4)) == [1, 6]
    with pytest.raises(ValueError, match="window_duration_us"):
        read_plain_trace(path, window_duration_us=0)
    with pytest.raises(TypeError, match="window_start_us"):
        read_plain_trace(path, window_start_us=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "line 1: the file is empty"),
        ("arrival_time_us,prompt_token_count,max_output_tokens\n", "header but no rows"),
        (
            "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,1\n-7,1,1\n",
            "line 3, column arrival_time_us: .*negative '-7'",
        ),
        (
            "arrival_time_us,prompt_token_count,max_output_tokens\n0,1.5,1\n",
            "line 2, column prompt_token_count: .*not an integer",
        ),
        (
            "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,-1\n",
            "line 2, column max_output_tokens: .*negative",
        ),
        ("arrival_time_us,prompt_token_count\n0,1\n", "missing columns"),
    ],
)
def test_plain_errors_name_file_line_and_column(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_plain_trace(write(tmp_path, body))


def test_the_scenario_example_trace_reads_as_a_plain_trace() -> None:
    requests = read_plain_trace(ROOT / "examples" / "scenarios" / "small_trace.csv")
    assert table(requests) == [(10, 5_000, 256, 4), (11, 5_000, 32, 12), (12, 90_000, 700, 2)]


# ---------------------------------------------------------------------- the rounding rule


@given(st.integers(min_value=0, max_value=10**30), st.integers(min_value=1, max_value=10**15))
def test_round_half_even_matches_pythons_fraction_rounding(
    numerator: int, denominator: int
) -> None:
    assert _round_half_even(numerator, denominator) == round(Fraction(numerator, denominator))


@given(
    st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=20),
    st.fractions(min_value=Fraction(1, 1000), max_value=1000),
)
def test_plain_scaling_is_one_exact_rounding(times: list[int], scale: Fraction) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        rows = "".join(f"{t},1,1\n" for t in times)
        path.write_text("arrival_time_us,prompt_token_count,max_output_tokens\n" + rows)
        got = arrivals(read_plain_trace(path, time_scale=scale))
    assert got == [round(Fraction(t) / scale) for t in sorted(times)]


def test_seconds_rule_agrees_with_seconds_to_us(tmp_path: Path) -> None:
    offsets = ["0.0000005", "0.0000015", "1.2345675", "0.1", "2.9999994"]
    rows = ["2023-01-01 00:00:00.0000000,1,1"] + [
        f"2023-01-01 00:00:0{o[0]}.{o[2:]},1,1" for o in offsets
    ]
    got = sorted(arrivals(read_azure_trace(azure(tmp_path, *rows))))
    assert got == sorted([0] + [simsim.seconds_to_us(float(o)) for o in offsets])


# ---------------------------------------------------------------------- the sample trace


def test_sample_trace_is_exactly_what_the_script_writes() -> None:
    committed = Path(str(SAMPLE_AZURE_TRACE)).read_text(encoding="utf-8")
    script = load_script(ROOT / "benchmarks" / "make_sample_trace.py", "make_sample_trace")
    assert committed == script.render()
    assert committed.startswith(AZURE_HEADER)
    assert committed.count("\n") == 201


def test_sample_trace_loads_and_runs_through_an_engine(
    engine: simsim.SimulationEngine,
) -> None:
    requests = read_azure_trace(SAMPLE_AZURE_TRACE)
    assert len(requests) == 200
    assert [r.request_id for r in requests] == list(range(200))
    times = arrivals(requests)
    assert times[0] == 0 and times == sorted(times)
    assert 120_000_000 < times[-1] < 300_000_000  # a few minutes
    assert all(r.prompt_token_count >= 2 and r.max_output_tokens >= 1 for r in requests)
    faster = read_azure_trace(SAMPLE_AZURE_TRACE, time_scale=4, window_duration_s=60)
    assert 0 < len(faster) < 200 and arrivals(faster)[-1] < 15_000_000
    for request in requests:
        engine.submit(request)
    engine.run()
    frame = engine.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    assert int(frame["generated_token_count"].sum()) == sum(r.max_output_tokens for r in requests)
