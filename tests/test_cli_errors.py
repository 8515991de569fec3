"""Bad input never shows a CLI user a traceback: one line naming the file, the key and the rule.

Each test runs the real command line (``simsim.cli.main``, or the ``simsim`` console
script in a subprocess) on a file that once ended in a Python traceback, a misleading
message or a memory error, and checks exit status 2 and a single stderr line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simsim.cli import main
from simsim.engines.base import EngineBase
from simsim.scenario import Scenario

BACKEND = """
[backend]
prefill_base_us = 100
decode_base_us = 10
"""

ONE_REQUEST = """
[[requests]]
request_id = 0
arrival_time_us = 0
prompt_token_count = 1
max_output_tokens = 1
"""

PLAIN_HEADER = "request_id,arrival_time_us,prompt_token_count,max_output_tokens\n"


def workload(body: str) -> str:
    return BACKEND + "[workload]\n" + body + "\n"


def write(directory: Path, text: str, name: str = "scenario.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``simsim *argv*``; it must exit 2 with one stderr line and no traceback."""
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    assert "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("simsim: error: ")
    return lines[0]


def assert_names(line: str, *parts: str) -> None:
    for part in parts:
        assert part in line, f"{part!r} not in {line!r}"


# ---------------------------------------------------------------- the scenario file


def test_non_utf8_byte_names_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.toml"
    path.write_bytes((BACKEND + ONE_REQUEST).encode() + b'[scenario]\nname = "caf\xe9"\n')
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: line 12: ", "not UTF-8 text (byte 0xe9")


def test_non_utf8_byte_through_the_console_script(tmp_path: Path) -> None:
    path = tmp_path / "scenario.toml"
    path.write_bytes(b"[backend]\nprefill_base_us = 1 # \xff\n" + ONE_REQUEST.encode())
    done = subprocess.run(
        [sys.executable, "-m", "simsim", "run", str(path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"simsim: error: {path}: line 2: not UTF-8 text (byte 0xff at offset 32); "
        "TOML files must be UTF-8"
    ]


# ---------------------------------------------------------------- traces


def test_time_scale_pushing_an_arrival_past_64_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, PLAIN_HEADER + "0,0,1,1\n1,5000000000000000000,1,1\n", "trace.csv")
    path = write(tmp_path, BACKEND + '[trace]\npath = "trace.csv"\ntime_scale = 0.5\n')
    line = one_line_error(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert_names(
        line,
        f"{path}: trace.time_scale: ",
        "trace.csv: line 3: ",
        "scaled arrival time 10000000000000000000 us",
        "past the 64-bit limit",
    )


def test_trace_first_request_id_near_the_64_bit_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "arrival_time_us,prompt_token_count,max_output_tokens\n0,1,1\n1,1,1\n", "t.csv")
    path = write(tmp_path, BACKEND + f'[trace]\npath = "t.csv"\nfirst_request_id = {2**63 - 1}\n')
    line = one_line_error(capsys, "validate", str(path))
    assert_names(
        line, f"{path}: trace.first_request_id: ", "2 replayed rows up to 9223372036854775808"
    )


def test_workload_first_request_id_near_the_64_bit_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "count = 3\nrate_per_s = 1.0\nprompt_tokens = 1\noutput_tokens = 1\n"
    body += f"first_request_id = {2**63 - 2}"
    path = write(tmp_path, workload(body))
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: workload.first_request_id: ", "past the 64-bit limit")


def test_closed_loop_first_request_id_near_the_64_bit_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "kind = 'closed_loop'\nusers = 2\nrequests_per_user = 2\nthink_time_us = 0\n"
    body += f"prompt_tokens = 1\noutput_tokens = 1\nfirst_request_id = {2**63 - 3}"
    path = write(tmp_path, workload(body))
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: workload.first_request_id: ", "numbers 4 requests")


def test_misspelt_trace_column_gets_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path, "arrival_time_us,prompt_tokens,max_output_tokens\n0,1,1\n", "t.csv")
    path = write(tmp_path, BACKEND + '[trace]\npath = "t.csv"\n')
    line = one_line_error(capsys, "validate", str(path))
    assert_names(
        line,
        f"{trace}: line 1: missing columns ['prompt_token_count']",
        "(did you mean 'prompt_tokens' for 'prompt_token_count'?)",
    )


@pytest.mark.parametrize(
    ("trace_format", "text"),
    [
        ("plain", PLAIN_HEADER.strip() + ",priority,user\n0,0,5,2,high,u1\n1,10,3,1,low,u2\n"),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens,Model\n"
            "2023-11-16 18:00:00,5,2,m\n2023-11-16 18:00:01,3,1,m\n",
        ),
    ],
)
def test_extra_trace_columns_are_accepted_and_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace_format: str, text: str
) -> None:
    write(tmp_path, text, "t.csv")
    path = write(tmp_path, BACKEND + f'[trace]\npath = "t.csv"\nformat = "{trace_format}"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "requests      2 (finished 2)" in captured.out


# ---------------------------------------------------------------- workloads


@pytest.mark.parametrize("cv", ["1e300", "1e-300"])
def test_gamma_cv_out_of_float_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cv: str
) -> None:
    arrivals = f"arrivals = {{ process = 'gamma', rate_per_s = 1.0, cv = {cv} }}"
    path = write(tmp_path, workload(f"count = 3\n{arrivals}\nprompt_tokens = 1\noutput_tokens = 1"))
    line = one_line_error(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert_names(line, f"{path}: workload.arrivals: cv = {float(cv)!r} is out of range")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("count", ["99_999_999_999"])
def test_huge_count_is_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], count: str
) -> None:
    # (A count past 64 bits is refused, as any integer of a file is, as past that limit.)
    path = write(
        tmp_path,
        workload(f"count = {count}\nrate_per_s = 1.0\nprompt_tokens = 1\noutput_tokens = 1"),
    )
    line = one_line_error(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert_names(
        line,
        f"{path}: workload.count: must be at most 10,000,000 (every request is held in memory, "
        f"about 1 GB per million), got {int(count):,}",
    )


@pytest.mark.parametrize(
    ("body", "key", "spelling"),
    [
        (
            "count = 3\nrate_per_s = 1.0\noutput_tokens = 1\n"
            'prompt_tokens = { distribution = "empirical", values = [10.0, 20] }',
            "workload.prompt_tokens.values[0]",
            "got float 10.0 (write 10: whole numbers are TOML integers)",
        ),
        (
            "count = 3\nrate_per_s = 1.0\noutput_tokens = 1\nprompt_tokens = 1\n"
            "shared_prefixes = { lengths = [64, 128.0] }",
            "workload.shared_prefixes.lengths[1]",
            "got float 128.0 (write 128: whole numbers are TOML integers)",
        ),
    ],
)
def test_a_whole_float_in_an_array_names_its_integer_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, key: str, spelling: str
) -> None:
    prefix_cache = "[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 100\n[prefix_cache]\n"
    head = '[scenario]\nengine = "batching"\n' + BACKEND + "[batching]\nmax_active_requests = 2\n"
    text = head + prefix_cache + "[workload]\n" + body + "\n"
    path = write(tmp_path, text)
    line = one_line_error(capsys, "validate", str(path))
    assert line == f"simsim: error: {path}: {key}: must be an integer, {spelling}"


def test_huge_closed_loop_user_count_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "kind = 'closed_loop'\nusers = 99999999999\nhorizon_us = 10\nthink_time_us = 0\n"
    path = write(tmp_path, workload(body + "prompt_tokens = 1\noutput_tokens = 1"))
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: workload.users: must be at most 10,000,000")


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("count = 0\nrate_per_s = 1.0\n", "workload.count"),
        (
            "total = 0\n[[workload.classes]]\nname = 'chat'\nrate_per_s = 1.0\n",
            "workload.total",
        ),
        (
            "[[workload.classes]]\nname = 'chat'\ncount = 0\nrate_per_s = 1.0\n",
            "workload.classes[0] (chat).count",
        ),
        ("kind = 'closed_loop'\nusers = 0\nhorizon_us = 10\nthink_time_us = 0\n", "workload.users"),
        (
            "kind = 'closed_loop'\nusers = 2\nhorizon_us = 0\nthink_time_us = 0\n",
            "workload.horizon_us",
        ),
    ],
)
def test_a_workload_of_no_request_is_refused_one_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, key: str
) -> None:
    # count = 0 and total = 0 used to run and print "requests 0 ()"; users = 0 was refused.
    path = write(tmp_path, workload(body + "prompt_tokens = 1\noutput_tokens = 1"))
    line = one_line_error(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert line == f"simsim: error: {path}: {key}: must be >= 1, got 0"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("replicas", ["100000000", "-3"])
def test_replica_counts_no_fleet_has_are_refused_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], replicas: str
) -> None:
    # Once: a minute and gigabytes for 10**6, no answer at all for 10**8.
    path = write(tmp_path, BACKEND + ONE_REQUEST + f"[cluster]\nreplicas = {replicas}\n")
    line = one_line_error(capsys, "validate", str(path))
    rule = "must be >= 1, got -3" if replicas == "-3" else "must be at most 10,000 per pool"
    assert_names(line, f"{path}: cluster.replicas: {rule}")


def test_lognormal_cv_past_float_range_is_refused_not_a_negative_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = "prompt_tokens = { distribution = 'lognormal', mean = 100, cv = 1e308 }"
    path = write(tmp_path, workload(f"count = 3\nrate_per_s = 1.0\n{tokens}\noutput_tokens = 1"))
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: workload.prompt_tokens: cv = 1e+308 is out of range")
    assert "negative" not in line


def test_empirical_weights_whose_sum_overflows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = (
        "prompt_tokens = { distribution = 'empirical', values = [1, 2], weights = [1e308, 1e308] }"
    )
    path = write(tmp_path, workload(f"count = 3\nrate_per_s = 1.0\n{tokens}\noutput_tokens = 1"))
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, f"{path}: workload.prompt_tokens: weights must have a finite sum")


# ---------------------------------------------------------------- --out


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return write(tmp_path, BACKEND + ONE_REQUEST)


def test_run_out_naming_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: Path
) -> None:
    target = write(tmp_path, "keep me", "results")
    line = one_line_error(capsys, "run", str(scenario), "--out", str(target))
    assert line == f"simsim: error: --out: {target} is a file, not a folder"
    assert target.read_text() == "keep me"


def test_run_out_in_an_unwritable_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: Path
) -> None:
    blocker = write(tmp_path, "", "file")
    # A folder under a file can never be made, whoever runs the test (root included).
    line = one_line_error(capsys, "run", str(scenario), "--out", str(blocker / "out"))
    assert line == (
        f"simsim: error: --out: cannot create the folder {blocker / 'out'} (Not a directory)"
    )


def test_run_out_checked_before_the_simulation_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    scenario: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bad --out must be refused before running")

    monkeypatch.setattr("simsim.cli.run.run_scenario", boom)
    target = write(tmp_path, "", "results")
    one_line_error(capsys, "run", str(scenario), "--out", str(target))


def test_sweep_out_naming_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = Path(__file__).resolve().parent.parent / "examples" / "sweeps" / "batching_load.toml"
    target = write(tmp_path, "", "results")
    line = one_line_error(capsys, "sweep", str(sweep), "--out", str(target), "--workers", "1")
    assert line == f"simsim: error: --out: {target} is a file, not a folder"


def test_plot_out_naming_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: Path
) -> None:
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    assert main(["run", str(scenario), "--out", str(results)]) == 0
    capsys.readouterr()
    target = write(tmp_path, "", "figures")
    line = one_line_error(capsys, "plot", str(results), "--out", str(target))
    assert line == f"simsim: error: --out: {target} is a file, not a folder"


# ---------------------------------------------------------------- the last line of defence


def test_an_unexpected_exception_is_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something simsim did not expect")

    monkeypatch.setattr("simsim.cli.run.run_scenario", bug)
    code = main(["run", str(scenario), "--out", str(scenario.parent / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        "simsim: internal error: RuntimeError: something simsim did not expect "
        "(a bug in simsim: please report it with the command and files used)"
    ]


# ---------------------------------------------------------------- nothing silently ignored


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        (
            ONE_REQUEST + "block_hashes = [1, 2]\n",
            "requests[0].block_hashes",
            'needs engine = "batching" with [kv_cache] and [prefix_cache]: only a prefix cache '
            "shares the blocks they name, and without one they would be ignored (with "
            "[prefix_cache] enabled = false they are left out on purpose)",
        ),
        (
            ONE_REQUEST + '[cluster]\nreplicas = 2\nrouter = "prefix_affinity"\n',
            "cluster.router",
            "'prefix_affinity' sends a request where its prefix is cached, and the replicas have "
            'no prefix cache (engine = "batching" with [kv_cache] and [prefix_cache]): it would '
            "send every request to the least loaded; use 'least_outstanding' for that, or add "
            "[prefix_cache]",
        ),
        (
            ONE_REQUEST
            + '[cluster]\nreplicas = 2\nrouter = "weighted"\nweights = { prefix = 1.0 }\n',
            "cluster.weights",
            "only 'prefix' is weighed, and the replicas have no prefix cache (engine = "
            '"batching" with [kv_cache] and [prefix_cache]): it would send every request to the '
            "least loaded; weigh 'queue' too, or add [prefix_cache]",
        ),
    ],
)
def test_what_only_a_prefix_cache_uses_is_refused_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, rule: str
) -> None:
    path = write(tmp_path, BACKEND + text)
    line = one_line_error(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert line == f"simsim: error: {path}: {key}: {rule}"


# ---------------------------------------------------------------- out of memory

CLUSTER = BACKEND + ONE_REQUEST + "[cluster]\nreplicas = 3\n"


def exit_1_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``simsim *argv*``; it must exit 1 with one stderr line and no traceback."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.rstrip("\n")


@pytest.mark.parametrize(
    "failure",
    [
        MemoryError(),
        # What CPython raises under a memory cap when an allocation's MemoryError is lost
        # (seen from SimulationEngine.__init__ with replicas = 100000000 and ulimit -v).
        SystemError(
            "<function SimulationEngine.__init__> returned NULL without setting an exception"
        ),
        SystemError("error return without exception set"),
    ],
)
def test_running_out_of_memory_names_what_was_being_built(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
) -> None:
    path = write(tmp_path, CLUSTER)
    built: list[int] = []

    def build_server(*args: object) -> None:
        if len(built) == 2:  # the third replica cannot be made
            raise failure
        built.append(1)

    monkeypatch.setattr(Scenario, "_build_server", build_server)
    assert exit_1_line(capsys, "validate", str(path)) == (
        f"simsim: error: {path}: out of memory while building the cluster's 3 replicas; make "
        "that smaller, or give simsim more memory"
    )


def _pending(cause: BaseException) -> SystemError:
    """The SystemError CPython raises when C code returns a result with *cause* pending
    (it chains the pending exception as the cause, as ``_PyErr_FormatFromCause`` does)."""
    error = SystemError("<built-in method f> returned a result with an exception set")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "error",
    [SystemError("a bug, not memory"), _pending(KeyError("k"))],
    ids=["plain", "pending-key-error"],
)
def test_another_system_error_is_still_an_internal_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: SystemError,
) -> None:
    def bug(*args: object) -> None:
        raise error

    monkeypatch.setattr(Scenario, "_build_server", bug)
    line = exit_1_line(capsys, "validate", str(write(tmp_path, CLUSTER)))
    assert line.startswith(f"simsim: internal error: SystemError: {error} (a bug in")


def test_a_pending_memory_error_is_out_of_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def build_server(*args: object) -> None:
        raise _pending(MemoryError())

    monkeypatch.setattr(Scenario, "_build_server", build_server)
    line = exit_1_line(capsys, "validate", str(write(tmp_path, CLUSTER)))
    assert line.endswith(
        "out of memory while building the cluster's 3 replicas; make that "
        "smaller, or give simsim more memory"
    )


def test_out_of_memory_while_running_says_so_and_how_many_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def step(self: object) -> None:
        raise MemoryError

    monkeypatch.setattr(EngineBase, "run_next_timestamp", step)
    path = write(
        tmp_path, workload("count = 12\nrate_per_s = 1.0\nprompt_tokens = 1\noutput_tokens = 1")
    )
    line = exit_1_line(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert line == (
        f"simsim: error: {path}: out of memory while running the simulation of 12 requests (its "
        "records grow with every event); make that smaller, or give simsim more memory"
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [(BACKEND + ONE_REQUEST, "1 request"), (CLUSTER, "1 request on 3 replicas")],
    ids=["server", "cluster"],
)
def test_out_of_memory_while_writing_the_tables_says_how_many_requests_and_replicas(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    size: str,
) -> None:
    def to_csv(self: object, *args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)
    path = write(tmp_path, text)
    line = exit_1_line(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert line == (
        f"simsim: error: {path}: out of memory while building and writing the result tables "
        f"of {size}; make that smaller, or give simsim more memory"
    )


CAPPED = """
import resource, sys
import simsim.cli
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
# Room for this much more than the interpreter with simsim loaded already takes.
resource.setrlimit(resource.RLIMIT_AS, (size + int(sys.argv[1]) * 2**20, resource.RLIM_INFINITY))
sys.exit(simsim.cli.main(sys.argv[2:]))
"""


def capped(megabytes: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """``simsim *argv*`` in a process allowed *megabytes* more than it needs to start."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the memory cap reads /proc/self/status (Linux)")
    return subprocess.run(
        [sys.executable, "-c", CAPPED, str(megabytes), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )


def test_a_real_memory_cap_ends_in_one_line_naming_the_workload(tmp_path: Path) -> None:
    # Ten million requests are allowed, but not in 300 MB: the line says what was too big.
    body = "count = 10_000_000\nrate_per_s = 1000.0\nprompt_tokens = 10\noutput_tokens = 1"
    path = write(tmp_path, workload(body))
    done = capped(300, "validate", str(path))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"simsim: error: {path}: out of memory while generating the workload's 10,000,000 "
        "requests; make that smaller, or give simsim more memory"
    ]


def test_a_prompt_that_can_never_fit_is_refused_within_a_small_memory_cap(tmp_path: Path) -> None:
    # Sixty 2,000,000-token prompts once cost 1.35 GB of block hashes before the refusal.
    text = (
        '[scenario]\nengine = "batching"\n'
        + BACKEND
        + "[batching]\nmax_active_requests = 4\n[kv_cache]\nblock_size_tokens = 16\n"
        + "total_blocks = 1000\n[prefix_cache]\n[workload]\ncount = 60\nrate_per_s = 1.0\n"
        + "prompt_tokens = 2_000_000\noutput_tokens = 10\n"
        + "[workload.shared_prefixes]\nlengths = [100]\n"
    )
    path = write(tmp_path, text)
    done = capped(300, "validate", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"simsim: error: {path}: workload: request 0 needs 125007 KV blocks for its 2000100 "
        "prompt and 10 output tokens, more than the whole cache (1000 blocks of 16 tokens); it "
        "could never run"
    ]


# ---------------------------------------------------------------- named where the fault is


@pytest.mark.parametrize(("target", "what"), [("nope.csv", "does not exist"), (".", "is a folder")])
def test_a_trace_path_that_is_no_file_names_the_scenario_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, what: str
) -> None:
    path = write(tmp_path, BACKEND + f'[trace]\npath = "{target}"\n')
    line = one_line_error(capsys, "validate", str(path))
    assert_names(line, str(path), "trace.path", what)


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('[grid]\n"scenario.seed" = [1, 2]\n', "grid.scenario.seed"),
        (
            '[grid]\n"workload.count" = [1]\n[cases.a]\n"scenario.seed" = 3\n',
            "cases.a.scenario.seed",
        ),
    ],
)
def test_a_sweep_that_sets_the_seed_names_the_sweep_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, key: str
) -> None:
    text = "[sweep]\nreplications = 1\n" + workload(
        "count = 3\nrate_per_s = 1.0\nprompt_tokens = 4\noutput_tokens = 2"
    ).replace("[backend]", "[base.backend]").replace("[workload]", "[base.workload]")
    path = write(tmp_path, text + table, "sweep.toml")
    line = one_line_error(capsys, "sweep", str(path), "--out", str(tmp_path / "out"))
    assert line == (
        f"simsim: error: {path}: {key}: the sweep sets each run's seed; use sweep.seed instead"
    )


def test_plot_on_an_unreadable_table_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "requests.csv").write_text("")
    line = one_line_error(capsys, "plot", str(tmp_path))
    assert_names(line, str(tmp_path / "requests.csv"), "not a table simsim wrote")
