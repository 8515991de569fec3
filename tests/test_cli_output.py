"""What ``simsim`` prints can be read: costs given on purpose, no NaN, times in ms or s.

A scenario file must say what its costs are (a forgotten ``[backend]`` would make every
latency 0); a metric that cannot be computed says why; the run table says whom each
latency row covers; durations read as ms or s, never ``1e+06``; ``--version`` answers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

import simsim
from simsim.cli import main, report
from simsim.scenario import load_scenario, parse_scenario

REQUEST = """
[[requests]]
request_id = {rid}
arrival_time_us = {arrival}
prompt_token_count = 4
max_output_tokens = {out}
"""

# A duration cell: ms with one decimal (or three below 1 ms), or seconds with one.
DURATION = re.compile(r"^(\d{1,4}\.\d ms|0\.\d{3} ms|\d{1,3}(,\d{3})*\.\d s)$")


def write(directory: Path, text: str, name: str = "scenario.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def request(rid: int, arrival: int = 0, out: int = 3) -> str:
    return REQUEST.format(rid=rid, arrival=arrival, out=out)


def run_table(capsys: pytest.CaptureFixture[str], path: Path, out: Path) -> list[str]:
    assert main(["run", str(path), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out.splitlines()


def row(lines: list[str], label: str) -> str:
    (line,) = [line for line in lines if line.startswith(f"{label} ")]
    return line


def duration_cells(line: str, label: str) -> list[str]:
    """The four mean/p50/p90/p99 cells of a latency row (12 characters each)."""
    body = line[14:]
    return [body[i : i + 12].strip() for i in range(0, 48, 12)]


# ---------------------------------------------------------------- [backend] is required


def test_a_file_without_backend_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, request(0))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"simsim: error: {path}: backend: missing table: every cost would be 0 and every "
        "latency 0 us; give the cost model (prefill_base_us, prefill_per_token_us, "
        "prefill_per_active_sequence_us, decode_base_us, decode_per_active_sequence_us), "
        "writing 0 explicitly for a cost that is zero"
    ]
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "backend: missing table" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_empty_backend_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[backend]\n" + request(0))
    assert main(["validate", str(path)]) == 2
    assert f"{path}: backend: the table is empty: every cost would be 0" in (
        capsys.readouterr().err
    )


def test_zero_costs_written_out_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[backend]\ndecode_base_us = 0\n" + request(0))
    assert load_scenario(path).backend == simsim.SimulatedBackendConfig()
    lines = run_table(capsys, path, tmp_path / "out")
    assert row(lines, "makespan") == "makespan      0.0 ms (first arrival to last end)"


def test_a_python_document_keeps_the_zero_defaults_unless_asked() -> None:
    document = {"requests": [{"request_id": 0, "arrival_time_us": 0,
                              "prompt_token_count": 1, "max_output_tokens": 1}]}  # fmt: skip
    assert parse_scenario(document).backend == simsim.SimulatedBackendConfig()
    with pytest.raises(ValueError, match="backend: missing table"):
        parse_scenario(document, require_backend=True)


# ---------------------------------------------------------------- the run table


def test_missing_metrics_say_why_instead_of_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The only request is cancelled on arrival: nothing was admitted or produced.
    text = "[backend]\ndecode_base_us = 10\n" + request(0)
    text += "[[cancellations]]\ntime_us = 0\nrequest_id = 0\n"
    lines = run_table(capsys, write(tmp_path, text), tmp_path / "out")
    output = "\n".join(lines)
    assert "nan" not in output.lower()
    assert row(lines, "throughput") == "throughput    n/a (the makespan is 0.0 ms)"
    assert row(lines, "queue delay") == "queue delay   n/a (no request was admitted)"
    assert row(lines, "TTFT") == "TTFT          n/a (no request produced a token)"
    assert row(lines, "e2e latency") == "e2e latency   n/a (no request finished)"
    assert row(lines, "TPOT") == "TPOT          n/a (no finished request produced 2+ tokens)"


def test_each_latency_row_says_whom_it_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Request 0 makes 3 tokens, 1 makes none (zero output), 2 makes one, and 3 is
    # cancelled while queued: 3 admitted, 2 with a first token, 3 finished, 1 with 2+.
    text = "[backend]\nprefill_base_us = 100\ndecode_base_us = 10\n"
    text += request(0) + request(1, out=0) + request(2, out=1) + request(3)
    text += "[[cancellations]]\ntime_us = 50\nrequest_id = 3\n"
    lines = run_table(capsys, write(tmp_path, text), tmp_path / "out")
    assert row(lines, "").endswith("p99   over")
    assert row(lines, "queue delay").endswith("   3 admitted requests")
    assert row(lines, "TTFT").endswith("   2 requests that produced a token")
    assert row(lines, "e2e latency").endswith("   3 finished requests")
    assert row(lines, "TPOT").endswith("   1 finished request with 2+ tokens")


def test_the_run_table_reports_occupancy_over_the_makespan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Request 0 holds the slot 0..130 us, request 1 waits 0..130 and runs 130..260: the
    # slot is busy all 260 us and one request is queued for half of them.
    text = "[backend]\nprefill_base_us = 100\ndecode_base_us = 10\n"
    text += request(0) + request(1)
    lines = run_table(capsys, write(tmp_path, text), tmp_path / "out")
    assert row(lines, "occupancy") == (
        "occupancy     100.0% of slot time busy, 1.00 requests in slots and 0.50 queued on average"
    )
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("metric")["value"]
    assert summary["utilization"] == 1.0
    assert summary["mean_queue_length"] == 0.5


def test_times_are_in_ms_or_s_never_scientific(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One request of a few microseconds, one of about 3 simulated years.
    text = "[backend]\ndecode_base_us = 1\n" + request(0, out=2)
    text += "[[requests]]\nrequest_id = 1\narrival_time_us = 1_000_000\n"
    text += "prompt_token_count = 100_000_000_000\nmax_output_tokens = 1\n"
    text = text.replace("decode_base_us = 1\n", "decode_base_us = 1\nprefill_per_token_us = 1\n")
    lines = run_table(capsys, write(tmp_path, text), tmp_path / "out")
    output = "\n".join(lines)
    assert not re.search(r"\d[eE][+-]?\d", output), output
    assert row(lines, "makespan") == "makespan      100,001.0 s (first arrival to last end)"
    for label in ("queue delay", "TTFT", "e2e latency"):
        for cell in duration_cells(row(lines, label), label):
            assert DURATION.match(cell), (label, cell)
    assert duration_cells(row(lines, "TPOT"), "TPOT") == ["0.001 ms"] * 4


@pytest.mark.parametrize(
    ("value_us", "shown"),
    [
        (0, "0.0 ms"),
        (1, "0.001 ms"),
        (999, "0.999 ms"),
        (1_000, "1.0 ms"),
        (1_765_650, "1765.7 ms"),
        (9_999_949, "9999.9 ms"),
        (10_000_000, "10.0 s"),
        (989_942_100, "989.9 s"),
        (2**63 - 1, "9,223,372,036,854.8 s"),
    ],
)
def test_duration_format(value_us: int, shown: str) -> None:
    assert report.duration(value_us) == shown


def test_report_numbers_are_never_scientific() -> None:
    assert report.number(3.69921875) == "3.69922"  # as :g, which the reports used
    assert report.number(1e20) == "100000000000000000000"
    assert report.number(float("nan")) == "-"


def test_the_default_run_prints_no_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 0  # the README's first command
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    assert "makespan      989.9 s (first arrival to last end)" in out
    assert re.search(r"^TTFT .*   \d+ requests that produced a token$", out, re.MULTILINE)


# ---------------------------------------------------------------- sweeps and --version


def test_the_sweep_report_shows_times_and_says_why_a_value_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Zero-output requests never produce a token: TTFT p99 is missing at every point.
    text = """
[sweep]
replications = 2
[base.backend]
prefill_base_us = 2000
decode_base_us = 8000
[base.workload]
count = 20
rate_per_s = 4.0
prompt_tokens = [16, 256]
output_tokens = 0
[grid]
"workload.rate_per_s" = [2.0, 8.0]
"""
    path = write(tmp_path, text, "sweep.toml")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index("2 points x 2 replications (means over replications):")
    table = lines[header + 1 : header + 5]
    assert "TTFT p99" in table[0] and "e2e latency p99" in table[0] and "tokens/s" in table[0]
    for line in table[2:]:
        cells = line.split()
        assert cells[2] == "n/a"  # point, rate, TTFT p99
        assert re.fullmatch(r"\d+\.\d", cells[3]) and cells[4] == "ms"
    assert lines[header + 5] == (
        "n/a: no run of that point had the metric (no request produced a token, say)"
    )
    assert "nan" not in "\n".join(lines).lower()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"simsim {simsim.__version__}\n"
