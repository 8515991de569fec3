"""``simsim sweep`` and ``simsim plot`` on a sweep folder: sweeps from the command line.

Resuming is tested for real: a ``python -m simsim sweep`` process is killed with
SIGKILL once a few runs are on disk, resumed and stopped with Ctrl-C, then run again
to the end; every finished run file must stay untouched (same bytes, same mtime), only
the missing runs run, and the tables must equal those of an uninterrupted run. SIGTERM
and SIGHUP sent to the main process alone must stop every process of the sweep (listed
from /proc) and leave a folder that resumes the same way. Bad sweep files exit with 2,
naming the file, the key and the rule, before anything is written. Every example in
``examples/sweeps/`` runs through the command line, and its folder is plotted.

The sweep files here use an inline ``[base]`` scenario with the cost model of the
examples and small workloads, so a run takes from 10 to 150 ms.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from test_cluster_results import BALANCE_ROWS

from simsim import cli, plots
from simsim.cli import main
from simsim.results import OVERLOAD_METRICS
from simsim.sweeps import SweepFolder
from simsim.sweeps.grid import expand_grid
from simsim.sweeps.spec import load_sweep
from simsim.sweeps.sweep import SUMMARY_COLUMNS
from simsim.sweeps.sweep_file import run_sweep

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "sweeps"
SWEEP_EXAMPLES = sorted(path.stem for path in EXAMPLES.glob("*.toml"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BACKEND = """
[base.backend]
prefill_base_us = 2000
prefill_per_token_us = 50
prefill_per_active_sequence_us = 100
decode_base_us = 8000
decode_per_active_sequence_us = 300
"""
BASE = (
    BACKEND
    + """[base.workload]
count = {count}
rate_per_s = 4.0
prompt_tokens = [16, 256]
output_tokens = [1, 64]
"""
)

# 2 cases x 2 rates x 2 replications = 8 runs of about 10 ms each.
SMALL = (
    "[sweep]\nreplications = 2\nseed = 5\n"
    + BASE.format(count=60)
    + """
[grid]
"workload.rate_per_s" = [2.0, 8.0]
[cases.single_slot]
"scenario.engine" = "single_slot"
[cases.batching_8]
"scenario.engine" = "batching"
"batching.max_active_requests" = 8
"""
)
SMALL_RUNS = 8

# 2 cases x 3 rates x 5 replications = 30 runs of about 0.15 s each, on one worker.
LONG = (
    "[sweep]\nreplications = 5\nseed = 11\n"
    + "[base.scenario]\nengine = 'batching'\n"
    + BASE.format(count=800)
    + """
[grid]
"workload.rate_per_s" = [2.0, 4.0, 8.0]
[cases.batching_4]
"batching.max_active_requests" = 4
[cases.batching_16]
"batching.max_active_requests" = 16
"""
)

# The fewest slots that keep p90 TTFT under 0.5 s, at two rates: 60 runs in about 1.5 s.
SLOTS_CAPACITY = (
    "[sweep]\nreplications = 3\nseed = 4\n"
    + "[base.scenario]\nengine = 'batching'\n"
    + BASE.format(count=120)
    + """
[capacity]
parameter = "batching.max_active_requests"
low = 1
high = 32
find = "min"
[capacity.targets]
ttft_us_p90 = 500_000
[cases.rate_4]
"workload.rate_per_s" = 4.0
[cases.rate_8]
"workload.rate_per_s" = 8.0
"""
)


class FakeTerminal(io.StringIO):
    """A stderr that says it is a terminal, so the progress bar draws."""

    def isatty(self) -> bool:
        return True


def write(directory: Path, text: str, name: str = "sweep.toml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def cli_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sweep_to_the_end(folder: Path, text: str, *, workers: int) -> Path:
    """Run the sweep file *text* from *folder* to the end; its results folder."""
    path = write(folder, text)
    out = folder / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", str(workers)]) == 0
    return out


def simsim_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "simsim", *argv]


def start_sweep(
    path: Path, out: Path, *, workers: int, start_new_session: bool = False
) -> subprocess.Popen[bytes]:
    """``simsim sweep`` of *path* into *out* in a child process, its output discarded."""
    return subprocess.Popen(
        simsim_command("sweep", str(path), "--out", str(out), "--workers", str(workers)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=start_new_session,
    )


def run_files(folder: Path) -> list[Path]:
    """The finished runs in a results folder (temporary ``.partial`` files left out)."""
    return sorted((folder / "runs").glob("*.json"))


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under *folder*: its bytes and its modification time in ns."""
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def expected_run_names(sweep_file: Path) -> set[str]:
    """``<point key>-<replication>.json`` for every run of a plain sweep file."""
    spec = load_sweep(sweep_file)
    return {
        f"{point.key}-{replication}.json"
        for point in expand_grid(spec.grid, spec.cases)
        for replication in range(spec.replications)
    }


def assert_same_tables(folder: Path, reference: Path) -> None:
    """``runs.csv`` and ``summary.csv`` of *folder* are those of *reference*, byte for byte."""
    for name in ("runs.csv", "summary.csv"):
        # The frames first, for a readable difference; then every byte (column order too).
        pd.testing.assert_frame_equal(pd.read_csv(folder / name), pd.read_csv(reference / name))
        assert (folder / name).read_bytes() == (reference / name).read_bytes(), name


def bar_segments(text: str, label: str) -> list[tuple[int, int]]:
    """The (done, total) of every redraw of a ``label [###---] done/total`` bar."""
    counts = []
    for segment in text.replace("\n", "\r").split("\r"):
        if segment:
            assert segment.startswith(f"{label} ["), segment
            done, total = segment.split("] ")[1].split(" ")[0].split("/")
            counts.append((int(done), int(total)))
    return counts


# ================================================================ help and arguments


def test_sweep_help_mentions_workers_and_dask(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sweep", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--out" in text
    assert "--workers" in text
    assert "--dask" in text


def test_zero_workers_exits_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SMALL)
    code, out, err = cli_run(
        capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "0"
    )
    assert code == 2
    assert out == ""
    assert "--workers" in err and "must be >= 1, got 0" in err
    assert not (tmp_path / "out").exists()


def test_workers_and_dask_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SMALL)
    with pytest.raises(SystemExit) as info:
        main(
            [
                "sweep",
                str(path),
                "--out",
                str(tmp_path / "out"),
                "--workers",
                "2",
                "--dask",
                "local",
            ]
        )
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ================================================================ kill and resume


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_runs(process: subprocess.Popen[str], out: Path, count: int) -> None:
    """Wait until *count* runs are on disk, while *process* is still running."""
    deadline = time.monotonic() + 60
    while len(run_files(out)) < count:
        assert process.poll() is None, "the sweep ended before it could be stopped"
        assert time.monotonic() < deadline, f"{count} runs not written within 60 s"
        time.sleep(0.01)


def resumed_line(kept: int, out: Path) -> str:
    """The line a resumed sweep starts its report with, *kept* runs loaded from *out*."""
    runs = "1 finished run in" if kept == 1 else f"{kept} finished runs in"
    return f"resumed: {runs} {out}/ {'was' if kept == 1 else 'were'} kept, not run again\n"


def kill_once_runs_are_in(process: subprocess.Popen[Any], out: Path, count: int) -> None:
    """SIGKILL the sweep *process* once *count* runs are in *out* (or at once on failure)."""
    try:
        wait_for_runs(process, out, count)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()


def finished_runs(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every finished run file: its bytes and its modification time in ns."""
    return {run.name: (run.read_bytes(), run.stat().st_mtime_ns) for run in run_files(out)}


def assert_untouched(out: Path, finished: dict[str, tuple[bytes, int]]) -> None:
    for name, (content, mtime_ns) in finished.items():
        run = out / "runs" / name
        assert run.read_bytes() == content, f"{name} was rewritten"
        assert run.stat().st_mtime_ns == mtime_ns, f"{name} was run again"


def test_a_killed_sweep_resumes_without_redoing_or_losing_a_finished_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, LONG)
    expected = expected_run_names(path)
    assert len(expected) == 30
    out = tmp_path / "resumed"
    command = simsim_command("sweep", str(path), "--out", str(out), "--workers", "1")

    # 1. One worker finishes runs one by one: SIGKILL the process once five are on disk.
    killed = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    kill_once_runs_are_in(killed, out, 5)
    assert killed.returncode == -signal.SIGKILL

    first = finished_runs(out)
    assert 5 <= len(first) < len(expected), "the kill should land midway"
    assert set(first) <= expected
    for content, _ in first.values():
        json.loads(content)  # whole files only: written to a temporary name, then renamed
    assert not (out / "runs.csv").exists()
    assert not (out / "summary.csv").exists()
    # An unfinished folder cannot be plotted yet.
    assert main(["plot", str(out)]) == 2
    assert "not a finished sweep folder: summary.csv is missing" in capsys.readouterr().err

    # A kill during a write leaves a truncated temporary file; plant one for sure.
    unfinished = sorted(expected - set(first))[0]
    (out / "runs" / f".{unfinished}.partial").write_text('{"key": "trunc', encoding="utf-8")

    # 2. Resume on two workers and press Ctrl-C (SIGINT to the whole process group,
    # workers included, as a terminal does) once five more runs are on disk.
    interrupted = subprocess.Popen(
        simsim_command("sweep", str(path), "--out", str(out), "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # A shell without job control starts background jobs with SIGINT ignored, and
        # Python then never installs its Ctrl-C handler: give the sweep a terminal's.
        preexec_fn=_default_sigint,
    )
    try:
        wait_for_runs(interrupted, out, len(first) + 5)
        os.killpg(interrupted.pid, signal.SIGINT)
        stdout, stderr = interrupted.communicate(timeout=60)
    finally:
        if interrupted.poll() is None:
            os.killpg(interrupted.pid, signal.SIGKILL)
            interrupted.wait()
    assert interrupted.returncode == 130, stderr
    assert stdout == ""  # the report, and what was kept, come at the end
    assert stderr.endswith(
        f"simsim: interrupted; finished runs are kept in {out}/: "
        "run the same command again to resume\n"
    )
    assert_untouched(out, first)
    second = finished_runs(out)
    assert len(first) + 5 <= len(second) < len(expected), "Ctrl-C should land midway"
    assert set(second) <= expected

    # 3. The first command again, to the end: it runs only what is missing.
    resumed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(resumed_line(len(second), out) + "6 points x 5 replications")
    assert resumed.stderr == ""  # not a terminal: no progress bar
    assert_untouched(out, second)
    assert {run.name for run in run_files(out)} == expected
    # The planted temporary file was replaced by its run: nothing else is left in runs/.
    assert sorted(run.name for run in (out / "runs").iterdir()) == sorted(expected)

    # The same sweep, uninterrupted, on two workers: the same tables and run files.
    reference = tmp_path / "reference"
    assert main(["sweep", str(path), "--out", str(reference), "--workers", "2"]) == 0
    capsys.readouterr()
    assert_same_tables(out, reference)
    for name in expected:
        assert (out / "runs" / name).read_bytes() == (reference / "runs" / name).read_bytes()
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 30
    replications = runs.groupby(["case", "workload.rate_per_s"])["replication"].apply(sorted)
    assert replications.tolist() == [[0, 1, 2, 3, 4]] * 6


# Every kind of scenario, each of whose runs reports its own metrics: a cluster adds
# load-balance rows after the others (once per pool when disaggregated), an admission
# control adds rejection counts in the middle. 2 points x 2 replications of 40 requests.
KIND_HEADER = (
    "[sweep]\nreplications = 2\nseed = 7\n"
    "[base.scenario]\nengine = 'batching'\n[base.batching]\nmax_active_requests = 4\n"
)
RATES = '[grid]\n"workload.rate_per_s" = [4.0, 16.0]\n'
CLUSTER = "[base.cluster]\nreplicas = 2\nrouter = 'least_outstanding'\n"
DISAGGREGATED = """
[base.cluster.prefill]
replicas = 1
[base.cluster.decode]
replicas = 2
[base.cluster.transfer]
kv_bytes_per_token = 65_536
bandwidth_bytes_per_s = 10_000_000_000
"""
CLASSES_WITH_ADMISSION = """
[base.workload]
total = 40
[[base.workload.classes]]
name = "chat"
rate_per_s = 4.0
prompt_tokens = [16, 256]
output_tokens = [1, 32]
[[base.workload.classes]]
name = "batch"
rate_per_s = 2.0
prompt_tokens = [256, 512]
output_tokens = [16, 64]
[base.admission.limits.batch]
max_queued = 2
[grid]
"workload.classes.batch.rate_per_s" = [1.0, 8.0]
"""
SCENARIO_KINDS = {
    "single_server": KIND_HEADER + BASE.format(count=40) + RATES,
    "cluster": KIND_HEADER + BASE.format(count=40) + CLUSTER + RATES,
    "disaggregated": KIND_HEADER + BASE.format(count=40) + DISAGGREGATED + RATES,
    "classes_with_admission": KIND_HEADER + BACKEND + CLASSES_WITH_ADMISSION,
}


def manifest_of_a_killed_sweep(out: Path, finished: Path) -> None:
    """Write to *out* the manifest a sweep writes before its first run (that of *finished*,
    without what only its end adds)."""
    manifest = json.loads((finished / "sweep.json").read_text(encoding="utf-8"))
    (out / "runs").mkdir(parents=True)
    (out / "sweep.json").write_text(
        json.dumps({key: manifest[key] for key in ("format", "fingerprint")}), encoding="utf-8"
    )


@pytest.mark.parametrize("kind", list(SCENARIO_KINDS))
def test_every_kind_of_scenario_resumes_to_the_tables_of_an_uninterrupted_sweep(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SCENARIO_KINDS[kind])
    reference, out = tmp_path / "reference", tmp_path / "out"
    code, _, _ = cli_run(capsys, "sweep", str(path), "--out", str(reference), "--workers", "1")
    assert code == 0
    runs = run_files(reference)
    assert len(runs) == 4
    # A folder that a kill left with the first replication of each point finished.
    manifest_of_a_killed_sweep(out, reference)
    for run in runs:
        if run.name.endswith("-0.json"):
            shutil.copy2(run, out / "runs" / run.name)
    code, stdout, _ = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 0
    assert stdout.startswith(resumed_line(2, out))
    assert_same_tables(out, reference)
    # Every run resumed: the tables come from the run files alone.
    (out / "runs.csv").unlink()
    (out / "summary.csv").unlink()
    code, stdout, _ = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 0
    assert stdout.startswith(resumed_line(4, out))
    assert_same_tables(out, reference)
    for run in runs:
        assert (out / "runs" / run.name).read_bytes() == run.read_bytes()


# 2 rates x 3 replications = 6 runs of 400 requests on a 2-replica cluster, about 0.1 s each.
KILLED_CLUSTER = (
    KIND_HEADER.replace("replications = 2", "replications = 3")
    + BASE.format(count=400)
    + CLUSTER
    + RATES
)


def test_a_killed_cluster_sweep_resumes_with_every_metric_of_its_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, KILLED_CLUSTER)
    out = tmp_path / "out"
    killed = start_sweep(path, out, workers=1)
    kill_once_runs_are_in(killed, out, 1)
    kept = len(run_files(out))
    assert 1 <= kept <= 6
    # Runs take about 0.1 s here, so the kill lands midway; on a machine fast enough to
    # finish first, the tables it wrote are removed and every run is resumed instead.
    for table in ("runs.csv", "summary.csv"):
        (out / table).unlink(missing_ok=True)

    code, stdout, _ = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 0
    assert stdout.startswith(resumed_line(kept, out))
    reference = tmp_path / "reference"
    code, _, _ = cli_run(capsys, "sweep", str(path), "--out", str(reference), "--workers", "1")
    assert code == 0
    assert_same_tables(out, reference)
    header = (out / "runs.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    overload = len(OVERLOAD_METRICS)  # the overload rows come last
    assert header[-len(BALANCE_ROWS) - overload : -overload] == BALANCE_ROWS


# 2 rates x 6 replications = 12 runs of about 0.05 s each, for the signal tests.
SIGNALLED = (
    "[sweep]\nreplications = 6\nseed = 3\n"
    + "[base.scenario]\nengine = 'batching'\n[base.batching]\nmax_active_requests = 8\n"
    + BASE.format(count=400)
    + '[grid]\n"workload.rate_per_s" = [2.0, 8.0]\n'
)


def _proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process from /proc, or ``None`` if none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name, in parentheses, may hold spaces: split after its last ")".
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below *root*, with its start time (to tell a reused pid apart)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[2]))
    found: dict[int, int] = {}
    stack = [root]
    while stack:
        for pid, start in children.get(stack.pop(), []):
            found[pid] = start
            stack.append(pid)
    return found


def survivors(processes: dict[int, int]) -> list[int]:
    """The processes still running (a zombie waiting to be reaped has ended)."""
    running = []
    for pid, start in processes.items():
        stat = _proc_stat(pid)
        if stat is not None and stat[2] == start and stat[1] != "Z":
            running.append(pid)
    return running


@contextlib.contextmanager
def stopping_the_group(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever happens, end every process left in *process*'s group (its own session)."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing left in the group: good
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def assert_every_worker_ends(
    process: subprocess.Popen[bytes],
    out: Path,
    stop: Callable[[], None],
    *,
    runs: int,
    within_s: float,
) -> None:
    """Once *runs* runs of the sweep *process* are in *out*, *stop* it: each process it
    started (its two workers) must have ended *within_s* seconds later."""
    wait_for_runs(process, out, runs)
    workers = descendants(process.pid)
    assert len(workers) >= 2, "the two workers should be running"
    stop()
    deadline = time.monotonic() + within_s
    while survivors(workers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert survivors(workers) == [], "a worker of the stopped sweep is still running"


def _default_stop_signals() -> None:
    # The suite may run under nohup (SIGHUP ignored): give the sweep a session's defaults.
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


@pytest.fixture(scope="module")
def signalled_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The signal tests' sweep, run to the end without a stop."""
    return sweep_to_the_end(tmp_path_factory.mktemp("signalled"), SIGNALLED, workers=2)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists processes in /proc")
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_main_process_stops_every_process_and_the_sweep_resumes(
    number: signal.Signals,
    signalled_reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A batch scheduler's SIGTERM, or a closed ssh session's SIGHUP, may reach the main
    # process only: send it there, not to the group as a terminal's Ctrl-C does.
    path = write(tmp_path, SIGNALLED)
    out = tmp_path / "out"
    # Output to files, not pipes: a worker left running would hold a pipe open.
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("w") as stdout_file, stderr_path.open("w") as stderr_file:
        stopped = subprocess.Popen(
            simsim_command("sweep", str(path), "--out", str(out), "--workers", "2"),
            stdout=stdout_file,
            stderr=stderr_file,
            start_new_session=True,  # its own group, so that clean-up below reaches all of it
            preexec_fn=_default_stop_signals,
        )
    with stopping_the_group(stopped):

        def stop() -> None:
            stopped.send_signal(number)
            stopped.wait(timeout=30)

        assert_every_worker_ends(stopped, out, stop, runs=2, within_s=10)
    stderr = stderr_path.read_text(encoding="utf-8")
    assert stopped.returncode == 128 + number, stderr
    assert stdout_path.read_text(encoding="utf-8") == ""
    assert stderr.endswith(
        f"simsim: stopped by {number.name}; finished runs are kept in {out}/: "
        "run the same command again to resume\n"
    )
    finished = run_files(out)
    assert 2 <= len(finished) < 12, "the signal should land midway"
    for run in finished:
        json.loads(run.read_text(encoding="utf-8"))  # whole files only
    assert not (out / "summary.csv").exists()

    # The same command again runs only what is missing, and gives the tables of a sweep
    # that was never stopped.
    code, stdout, _ = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "2")
    assert code == 0
    assert stdout.startswith(resumed_line(len(finished), out))
    assert len(run_files(out)) == 12
    assert_same_tables(out, signalled_reference)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists processes in /proc")
def test_the_workers_exit_when_the_main_process_alone_is_killed(tmp_path: Path) -> None:
    # SIGKILL gives the sweep no chance to stop its workers: they must see it is gone.
    path = write(tmp_path, SIGNALLED)
    out = tmp_path / "out"
    # In its own group, so that clean-up below reaches all of it.
    killed = start_sweep(path, out, workers=2, start_new_session=True)
    with stopping_the_group(killed):

        def stop() -> None:
            killed.kill()
            killed.wait()

        # The "within a few seconds": a worker sees its lifeline close at once
        # (and, failing that, its parent change within a second).
        assert_every_worker_ends(killed, out, stop, runs=1, within_s=5)


def test_stray_partial_files_are_ignored_and_half_written_runs_run_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SMALL)
    reference, out = tmp_path / "reference", tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(reference), "--workers", "1"]) == 0
    # A folder with files but no manifest is not a sweep's: it is refused, untouched.
    write(out, "{not json", "runs/.x.json.partial")
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 2
    assert "holds no sweep" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == [".x.json.partial", "runs"]
    # A stray temporary file in a sweep's own folder is ignored.
    (out / "runs" / ".x.json.partial").unlink()
    (out / "runs").rmdir()
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    write(out, "{not json", "runs/.x.json.partial")
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert_same_tables(out, reference)

    # Lose two finished runs, one of them half written, and add another stray file.
    lost = run_files(out)[:2]
    for run in lost:
        run.unlink()
    write(out, '{"key": "', f"runs/.{lost[0].name}.partial")
    write(out, "", "runs/.y.json.partial")
    (out / "runs.csv").unlink()
    (out / "summary.csv").unlink()
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    capsys.readouterr()
    assert_same_tables(out, reference)
    assert [run.name for run in run_files(out)] == [run.name for run in run_files(reference)]
    for run in lost:
        assert run.read_bytes() == (reference / "runs" / run.name).read_bytes()
    stray = sorted(path.name for path in (out / "runs").glob(".*"))
    assert stray == [".x.json.partial", ".y.json.partial"]  # left alone, never read


def test_extending_the_grid_runs_only_the_new_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    before = {run.name: run.stat().st_mtime_ns for run in run_files(out)}
    first = pd.read_csv(out / "runs.csv")

    write(tmp_path, SMALL.replace("[2.0, 8.0]", "[2.0, 4.0, 8.0]"))
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    capsys.readouterr()
    after = {run.name: run.stat().st_mtime_ns for run in run_files(out)}
    assert len(after) == 12
    assert {name: after[name] for name in before} == before
    # The old points are renumbered but keep their seeds and metrics.
    keys = ["case", "workload.rate_per_s", "replication"]
    second = pd.read_csv(out / "runs.csv")
    old = second[second["workload.rate_per_s"] != 4.0]
    pd.testing.assert_frame_equal(
        old.drop(columns="point").sort_values(keys).reset_index(drop=True),
        first.drop(columns="point").sort_values(keys).reset_index(drop=True),
    )


# ================================================================ executors


@pytest.fixture(scope="module")
def serial_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sweep_to_the_end(tmp_path_factory.mktemp("serial"), SMALL, workers=1)


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(["--workers", "2"], id="two-workers"),
        pytest.param(
            ["--dask", "local"],
            id="dask-local",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("distributed") is None,
                reason="Dask's distributed package is not installed",
            ),
        ),
    ],
)
def test_workers_and_dask_give_the_serial_tables(
    where: list[str],
    serial_small: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    code, stdout, err = cli_run(capsys, "sweep", str(path), "--out", str(out), *where)
    assert code == 0, err
    assert "4 points x 2 replications" in stdout
    assert f"results in {out}/: runs.csv, summary.csv" in stdout
    assert_same_tables(out, serial_small)
    assert len(pd.read_csv(out / "runs.csv")) == SMALL_RUNS


# ================================================================ refused folders


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("seed = 5", "seed = 6", id="another-sweep-seed"),
        pytest.param("decode_base_us = 8000", "decode_base_us = 9000", id="another-base"),
    ],
)
def test_a_folder_from_a_different_sweep_is_refused_and_kept(
    old: str, new: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    path = write(tmp_path, SMALL)
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    before = snapshot(out)
    capsys.readouterr()

    assert old in SMALL
    other = write(tmp_path, SMALL.replace(old, new), "other.toml")
    code, _, err = cli_run(capsys, "sweep", str(other), "--out", str(out), "--workers", "1")
    assert code == 2
    assert err.startswith(f"simsim: error: {out} holds the results of a different sweep")
    assert "use another output folder or delete it" in err
    assert snapshot(out) == before


def test_a_refused_folder_is_not_announced_as_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sweep", str(write(tmp_path, SMALL)), "--out", str(out), "--workers", "1"]) == 0
    capsys.readouterr()
    other = write(tmp_path, SMALL.replace("seed = 5", "seed = 6"), "other.toml")
    code, stdout, _ = cli_run(capsys, "sweep", str(other), "--out", str(out), "--workers", "1")
    assert code == 2
    assert "resum" not in stdout


def test_a_run_file_copied_under_another_runs_name_exits_2_naming_it(
    tmp_path: Path, serial_small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    shutil.copytree(serial_small, out)
    first, second = run_files(out)[:2]
    second.write_bytes(first.read_bytes())  # a run saved under the wrong name
    (out / "summary.csv").unlink()
    before = snapshot(out)
    path = write(tmp_path, SMALL)
    code, stdout, err = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 2
    assert stdout == ""
    assert err.startswith(f"simsim: error: {second}: the run file does not match its name: ")
    assert err.count("\n") == 1
    assert snapshot(out) == before  # nothing loaded, nothing written


def test_a_run_results_folder_is_not_overwritten_by_a_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    scenario = ROOT / "examples" / "scenarios" / "small.toml"
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    before = snapshot(out)
    path = write(tmp_path, SMALL)
    code, _, _ = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    after = snapshot(out)
    assert {name: after.get(name) for name in before} == before
    assert code != 0


# ================================================================ bad sweep files

CAPACITY = """
[capacity]
parameter = "workload.rate_per_s"
low = 1.0
high = 8.0
[capacity.targets]
ttft_us_p99 = 2_000_000
"""

GOOD_BASE = BASE.format(count=20)

# (sweep file text, key at fault, words of the rule)
BAD_SWEEPS = [
    pytest.param(
        "[sweep]\n[gird]\n" + GOOD_BASE,
        "gird",
        "unknown key (did you mean 'grid'?)",
        id="unknown-top-level-key",
    ),
    pytest.param(
        "[sweep]\nreplication = 2\n" + GOOD_BASE,
        "sweep.replication",
        "unknown key (did you mean 'replications'?)",
        id="unknown-sweep-key",
    ),
    pytest.param(
        '[sweep]\nscenario = "scenario.toml"\n' + GOOD_BASE,
        "sweep.scenario",
        "give either sweep.scenario (a scenario file) or an inline [base] scenario table",
        id="scenario-and-base",
    ),
    pytest.param(
        "[sweep]\nreplications = 2\n",
        "sweep.scenario",
        "give either sweep.scenario (a scenario file) or an inline [base] scenario table",
        id="neither-scenario-nor-base",
    ),
    pytest.param(
        "[sweep]\nreplications = 0\n" + GOOD_BASE,
        "sweep.replications",
        "must be >= 1, got 0",
        id="zero-replications",
    ),
    pytest.param(
        "[sweep]\nreplications = -3\n" + GOOD_BASE,
        "sweep.replications",
        "must be >= 1, got -3",
        id="negative-replications",
    ),
    pytest.param(
        "[sweep]\nreplications = 1_000_000_000_000\n" + GOOD_BASE,
        "sweep.replications",
        "must be at most 1,000,000 (the most runs a sweep may make; every run is a whole "
        "simulation), got 1,000,000,000,000",
        id="replications-no-sweep-means",
    ),
    pytest.param(
        "[sweep]\nconfidence = 1.5\n" + GOOD_BASE,
        "sweep.confidence",
        "must be strictly between 0 and 1, got 1.5",
        id="confidence-above-1",
    ),
    pytest.param(
        '[sweep]\n[grid]\n"workload.rate_per_s" = 2.0\n' + GOOD_BASE,
        "grid.workload.rate_per_s",
        "must be an array of values, got 2.0",
        id="grid-value-not-an-array",
    ),
    pytest.param(
        '[sweep]\n[grid]\n"workload.rat_per_s" = [2.0, 4.0]\n' + GOOD_BASE,
        "workload.rat_per_s",
        "unknown key (did you mean 'rate_per_s'?)",
        id="grid-key-not-a-scenario-key",
    ),
    pytest.param(
        '[sweep]\n[cases.warp]\n"scenario.engine" = "warp"\n' + GOOD_BASE,
        "[warp]: scenario.engine",
        "unknown value 'warp'",
        id="case-makes-the-scenario-invalid",
    ),
    pytest.param(
        '[sweep]\n[grid]\n"backend.decode_base_us" = [8000, -5]\n' + GOOD_BASE,
        "backend.decode_base_us=-5]: backend.decode_base_us",
        "must be >= 0, got -5",
        id="grid-value-makes-the-scenario-invalid",
    ),
    pytest.param(
        "[sweep]\n" + CAPACITY.replace("low = 1.0", "low = 8.0") + GOOD_BASE,
        "capacity.high",
        "must be above low (8.0), got 8.0",
        id="capacity-low-not-below-high",
    ),
    pytest.param(
        '[sweep]\n[grid]\n"workload.rate_per_s" = [1.0, 2.0]\n' + CAPACITY + GOOD_BASE,
        "capacity.parameter",
        "'workload.rate_per_s' is searched, so it cannot also be a grid key",
        id="capacity-parameter-in-grid",
    ),
    pytest.param(
        "[sweep]\n" + CAPACITY.replace("ttft_us_p99", "ttft_p99") + GOOD_BASE,
        "capacity.targets",
        "unknown metric 'ttft_p99'",
        id="unknown-target-metric",
    ),
    pytest.param(
        "[sweep]\nreplications = 1\n" + CAPACITY + GOOD_BASE,
        "sweep.replications",
        "a capacity search needs at least 2",
        id="capacity-with-one-replication",
    ),
    pytest.param(
        "[sweep]\n"
        + CAPACITY.replace("high = 8.0", "high = -2.0").replace("low = 1.0", "low = -4.0")
        + GOOD_BASE,
        "workload.rate_per_s",
        "must be a finite number > 0",
        id="capacity-bounds-make-the-scenario-invalid",
    ),
    pytest.param(
        '[sweep]\nload = "workload.count"\n[grid]\n"workload.rate_per_s" = [1.0]\n' + GOOD_BASE,
        "sweep.load",
        "must name one of the grid's keys ['workload.rate_per_s'], got 'workload.count'",
        id="load-not-a-grid-axis",
    ),
    pytest.param(
        "[sweep\nreplications = 2\n" + GOOD_BASE,
        "",
        "not valid TOML: Expected ']' at the end of a table declaration (at line 1",
        id="invalid-toml",
    ),
]


@pytest.mark.parametrize(("text", "key", "rule"), BAD_SWEEPS)
def test_a_bad_sweep_file_exits_2_naming_the_file_and_key(
    text: str, key: str, rule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, GOOD_BASE.replace("[base.", "["), "scenario.toml")
    path = write(tmp_path, text)
    out = tmp_path / "out"
    code, stdout, err = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 2
    assert stdout == ""
    assert err.startswith(f"simsim: error: {path}")
    assert key in err
    assert rule in err
    assert err.count("\n") == 1  # one line, no traceback
    assert not out.exists()  # refused before anything is written


def test_a_missing_scenario_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '[sweep]\nscenario = "missing.toml"\n')
    out = tmp_path / "out"
    code, _, err = cli_run(capsys, "sweep", str(path), "--out", str(out))
    assert code == 2
    assert f"{tmp_path / 'missing.toml'}: cannot read the file (No such file or directory)" in err
    assert not out.exists()


def test_a_missing_scenario_file_error_names_the_sweep_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '[sweep]\nscenario = "missing.toml"\n')
    code, _, err = cli_run(capsys, "sweep", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    assert f"{path}: sweep.scenario" in err


def test_a_missing_sweep_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.toml"
    code, _, err = cli_run(capsys, "sweep", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    assert f"{path}: cannot read the file" in err


# ================================================================ capacity search


def ci_high(summary: pd.DataFrame, parameter: str, value: float, metric: str) -> float:
    """The upper end of *metric*'s interval at one probed value of a capacity search."""
    at = summary[(summary[parameter] == value) & (summary["metric"] == metric)]
    assert len(at) == 1
    return float(at["ci_high"].iloc[0])


def check_capacity_table(
    folder: Path, cases: list[str], targets: Mapping[str, float], tolerance: float
) -> pd.DataFrame:
    """capacity.csv against summary.csv: the value meets every target, the other end misses."""
    table = pd.read_csv(folder / "capacity.csv")
    assert table["configuration"].tolist() == cases
    summary = pd.read_csv(folder / "summary.csv")
    assert summary["case"].drop_duplicates().tolist() == cases
    runs = pd.read_csv(folder / "runs.csv")
    assert len(runs) == table["runs"].sum() == len(run_files(folder))
    for row in table.to_dict("records"):
        assert row["status"] == "found"
        meets = row["interval_low"] if row["find"] == "max" else row["interval_high"]
        misses = row["interval_high"] if row["find"] == "max" else row["interval_low"]
        assert row["value"] == meets
        assert 0 < row["interval_high"] - row["interval_low"] <= tolerance
        assert len(runs[runs["case"] == row["configuration"]]) == row["runs"]
        probes = summary[summary["case"] == row["configuration"]]
        assert probes["point"].nunique() == row["probes"]

        upper = {
            (value, metric): ci_high(probes, row["parameter"], value, metric)
            for value in (meets, misses)
            for metric in targets
        }
        assert all(upper[meets, metric] <= limit for metric, limit in targets.items())
        assert any(not upper[misses, metric] <= limit for metric, limit in targets.items())
    return table


@pytest.fixture(scope="module")
def slots_capacity(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """SLOTS_CAPACITY run once on a (fake) terminal: its folder, stdout and stderr."""
    folder = tmp_path_factory.mktemp("slots")
    path = write(folder, SLOTS_CAPACITY)
    with pytest.MonkeyPatch.context() as monkeypatch:
        code, stdout, stderr = run_on_a_terminal(
            monkeypatch, "sweep", str(path), "--out", str(folder / "out"), "--workers", "1"
        )
    assert code == 0, stderr
    return folder / "out", stdout, stderr


def test_a_capacity_search_for_the_fewest_slots_writes_one_row_per_case(
    slots_capacity: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, stdout, _ = slots_capacity
    table = check_capacity_table(out, ["rate_4", "rate_8"], {"ttft_us_p90": 500_000}, 1)
    # Integer bounds: an integer search that ends on adjacent values.
    assert (table["interval_high"] - table["interval_low"] == 1).all()
    assert table["value"].dtype == np.int64
    # More load needs at least as many slots.
    assert table["value"].iloc[0] <= table["value"].iloc[1]
    lines = stdout.splitlines()
    for row in table.to_dict("records"):
        low, high = row["interval_low"], row["interval_high"]
        assert (
            f"{row['configuration']}: min batching.max_active_requests = {row['value']} "
            f"(found; capacity within [{low}, {high}], {row['runs']} runs)"
        ) in lines
    assert f"results in {out}/: runs.csv, summary.csv, capacity.csv" in lines

    # Run again: the bisection replays from the stored runs, runs nothing and writes the
    # same tables.
    before = snapshot(out)
    path = out.parent / "sweep.toml"
    code, again, err = cli_run(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 0, err
    runs = len(run_files(out))
    assert again == resumed_line(runs, out) + stdout
    after = snapshot(out)
    assert after.keys() == before.keys()
    for name, (content, mtime_ns) in before.items():
        assert after[name][0] == content, name
        if name.startswith("runs/"):
            assert after[name][1] == mtime_ns, f"{name} was run again"


# ================================================================ the examples


@pytest.fixture(scope="module")
def run_example(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[subprocess.CompletedProcess[str], Path]]:
    """Run an example sweep file once, from an empty folder, as documented in it."""
    done: dict[str, tuple[subprocess.CompletedProcess[str], Path]] = {}

    def run(name: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        if name not in done:
            cwd = tmp_path_factory.mktemp(name)
            result = subprocess.run(
                simsim_command(
                    "sweep", str(EXAMPLES / f"{name}.toml"), "--out", "results", "--workers", "2"
                ),
                cwd=cwd,
                capture_output=True,
                text=True,
                check=False,
            )
            done[name] = (result, cwd / "results")
        return done[name]

    return run


def test_the_sweep_examples_are_found() -> None:
    # Each is run below; these two also have checks of their own.
    assert {"batching_load", "capacity"} <= set(SWEEP_EXAMPLES)


@pytest.mark.parametrize("name", SWEEP_EXAMPLES)
def test_every_sweep_example_runs_from_the_command_line(
    name: str, run_example: Callable[[str], tuple[subprocess.CompletedProcess[str], Path]]
) -> None:
    result, folder = run_example(name)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "results in results/: runs.csv, summary.csv" in result.stdout
    assert "simulated from the cost model, not measured on hardware" in result.stdout
    manifest = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "simsim-sweep"
    runs = pd.read_csv(folder / "runs.csv")
    assert len(runs) == len(run_files(folder))
    assert runs["seed"].is_unique
    # Every request of every run finished, and every interval holds its mean.
    assert (runs["count_FINISHED"] == runs["requests"]).all()
    summary = pd.read_csv(folder / "summary.csv")
    measured = summary.dropna(subset=["ci_low", "ci_high"])
    assert len(measured) > 0.9 * len(summary)
    assert (measured["ci_low"] <= measured["mean"] + 1e-9 * measured["mean"].abs()).all()
    assert (measured["mean"] <= measured["ci_high"] + 1e-9 * measured["mean"].abs()).all()


def test_the_batching_load_example_shows_batching_outlasting_the_single_slot(
    run_example: Callable[[str], tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    result, folder = run_example("batching_load")
    assert result.returncode == 0, result.stderr
    assert "15 points x 3 replications (means over replications):" in result.stdout
    runs = pd.read_csv(folder / "runs.csv")
    assert len(runs) == 45
    assert (runs["requests"] == 300).all()
    summary = pd.read_csv(folder / "summary.csv")

    def mean(metric: str, case: str, rate: float) -> float:
        row = summary[
            (summary["metric"] == metric)
            & (summary["case"] == case)
            & (summary["workload.rate_per_s"] == rate)
        ]
        assert len(row) == 1
        return float(row["mean"].iloc[0])

    # At 6 requests/s the single slot saturates: seconds of TTFT, a fraction of the tokens.
    ttft = "ttft_us_p99"
    assert mean(ttft, "single_slot", 6.0) > 10 * mean(ttft, "batching_16", 6.0)
    tokens = "throughput_tokens_per_s"
    assert mean(tokens, "batching_16", 6.0) > 2 * mean(tokens, "single_slot", 6.0)
    # Under light load every configuration carries the same tokens, within 10%.
    light = [mean(tokens, case, 0.5) for case in ("single_slot", "batching_8", "batching_16")]
    assert max(light) < 1.1 * min(light)


def test_the_capacity_example_writes_capacity_csv_and_reports_each_case(
    run_example: Callable[[str], tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    result, folder = run_example("capacity")
    assert result.returncode == 0, result.stderr
    targets = {"ttft_us_p99": 2_000_000, "tpot_us_p90": 50_000}
    table = check_capacity_table(folder, ["slots_8", "slots_16"], targets, 0.25)
    assert ((table["value"] > 0.5) & (table["value"] < 20.0)).all()
    lines = result.stdout.splitlines()
    for row in table.to_dict("records"):
        assert (
            f"{row['configuration']}: max workload.rate_per_s = {row['value']:g} "
            f"(found; capacity within [{row['interval_low']:g}, {row['interval_high']:g}], "
            f"{row['runs']} runs)"
        ) in lines
    assert "results in results/: runs.csv, summary.csv, capacity.csv" in lines


# ================================================================ plots


def check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert image[..., :3].std() > 0.01  # something is drawn


def test_plot_on_a_sweep_folder_writes_latency_and_throughput_figures(
    run_example: Callable[[str], tuple[subprocess.CompletedProcess[str], Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result, folder = run_example("batching_load")
    assert result.returncode == 0, result.stderr
    code, stdout, err = cli_run(capsys, "plot", str(folder), "--out", str(tmp_path))
    assert code == 0, err
    names = ["sweep_latency.png", "sweep_throughput.png"]
    assert stdout.splitlines() == [str(tmp_path / name) for name in names]
    assert sorted(path.name for path in tmp_path.iterdir()) == names
    for name in names:
        check_png(tmp_path / name)


def test_sweep_figures_draw_one_shaded_line_per_configuration_against_load(
    run_example: Callable[[str], tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    result, folder = run_example("batching_load")
    assert result.returncode == 0, result.stderr
    sweep = SweepFolder.read(folder)
    assert sweep.load == "workload.rate_per_s"
    cases = ["single_slot", "batching_8", "batching_16"]
    for draw, panels in ((plots.draw_sweep_latency, 9), (plots.draw_sweep_throughput, 4)):
        fig = draw(sweep)
        try:
            axes = [ax for ax in fig.axes if ax.get_visible()]
            assert len(axes) == panels
            for ax in axes:
                lines = ax.get_lines()
                assert [line.get_label() for line in lines] == cases, ax.get_title()
                for line in lines:
                    x = np.asarray(line.get_xdata(), dtype=np.float64)
                    assert x.tolist() == [0.5, 1.0, 1.5, 3.0, 6.0]
                assert len(ax.collections) == len(cases)  # one shaded interval per line
            titles = {ax.get_title() for ax in axes}
        finally:
            plt.close(fig)
        if draw is plots.draw_sweep_latency:
            assert {"TTFT p50", "TTFT p99", "TPOT p90", "end-to-end latency p99"} <= titles
        else:
            assert "goodput (requests meeting the SLOs / s)" in titles


def test_sweep_figures_shade_intervals_only_within_each_metrics_range(tmp_path: Path) -> None:
    # A summary as a folder written before intervals were clipped may hold it: a TTFT
    # interval reaching below 0 and an SLO attainment interval reaching above 1.
    rows = []
    for point, rate in enumerate((1.0, 2.0)):
        for metric, mean, low, high in (
            ("ttft_us_p50", 2_000.0, -3_000.0, 7_000.0),
            ("throughput_requests_per_s", 1.5, -0.5, 3.5),
            ("throughput_tokens_per_s", 30.0, 10.0, 50.0),
            ("goodput_requests_per_s", 1.2, -0.2, 2.6),
            ("slo_attainment", 0.9, 0.6, 1.2),
        ):
            rows.append((point, rate, metric, mean, 1.0, 3, low, high))
    summary = pd.DataFrame(rows, columns=["point", "workload.rate_per_s", *SUMMARY_COLUMNS])
    folder = SweepFolder(tmp_path, summary, "workload.rate_per_s", (), 0.95)
    shaded: dict[str, tuple[float, float]] = {}
    for draw in (plots.draw_sweep_latency, plots.draw_sweep_throughput):
        fig = draw(folder)
        try:
            for ax in fig.axes:
                for band in ax.collections:
                    y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
                    shaded[ax.get_title()] = (float(y.min()), float(y.max()))
        finally:
            plt.close(fig)
    assert shaded["TTFT p50"] == (0.0, 7.0)  # in ms
    assert shaded["finished requests / s"] == (0.0, 3.5)
    assert shaded["generated tokens / s"] == (10.0, 50.0)
    assert shaded["goodput (requests meeting the SLOs / s)"] == (0.0, 2.6)
    assert shaded["SLO attainment (fraction of requests)"] == (0.6, 1.0)


def test_plot_on_a_sweep_without_a_grid_axis_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases_only = SMALL.replace('[grid]\n"workload.rate_per_s" = [2.0, 8.0]\n', "")
    path = write(tmp_path, cases_only)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert "2 points x 2 replications" in capsys.readouterr().out
    code, stdout, err = cli_run(capsys, "plot", str(out))
    assert code == 2
    assert stdout == ""
    assert f"simsim: error: {out}: the sweep has no grid axis to plot against" in err
    assert not list(out.glob("*.png"))


def test_plot_on_an_unfinished_sweep_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"

    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(write(tmp_path, SMALL)), out=out, workers=1, progress=stop_after_three)
    assert len(run_files(out)) == 3
    code, _, err = cli_run(capsys, "plot", str(out))
    assert code == 2
    assert f"{out} is not a finished sweep folder: summary.csv is missing" in err
    assert not list(out.glob("*.png"))


# ================================================================ progress bar


def run_on_a_terminal(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str]:
    """Run ``simsim`` with a terminal as stderr and a bar that draws at once."""
    stdout, terminal = io.StringIO(), FakeTerminal()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(
        "simsim.cli.sweep.ProgressBar", functools.partial(cli.ProgressBar, delay_s=0.0)
    )
    code = main(list(argv))
    monkeypatch.undo()
    return code, stdout.getvalue(), terminal.getvalue()


def test_the_sweep_progress_bar_counts_runs_up_to_all_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SMALL)
    code, stdout, text = run_on_a_terminal(
        monkeypatch, "sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"
    )
    assert code == 0
    assert "4 points x 2 replications" in stdout
    assert text.startswith("\rsweep [")
    assert text.endswith("\n") and text.count("\n") == 1
    assert f"\rsweep [{'#' * 30}] {SMALL_RUNS}/{SMALL_RUNS} (" in text
    counts = bar_segments(text, "sweep")
    assert {total for _, total in counts} == {SMALL_RUNS}
    done = [d for d, _ in counts]
    assert done == sorted(done) and done[-1] == SMALL_RUNS
    assert set(range(SMALL_RUNS + 1)) <= set(done)  # one redraw per finished run

    # Off a terminal (as captured here), the bar stays silent.
    code, _, err = cli_run(
        capsys, "sweep", str(path), "--out", str(tmp_path / "b"), "--workers", "1"
    )
    assert code == 0 and err == ""


def test_the_capacity_progress_bar_ends_at_all_runs(
    slots_capacity: tuple[Path, str, str],
) -> None:
    out, _, text = slots_capacity
    runs = len(run_files(out))
    counts = bar_segments(text, "capacity search")
    assert counts[-1] == (runs, runs)
    # Totals are estimates while the search goes on; they never fall below what is done.
    assert all(done <= total for done, total in counts)
    assert [d for d, _ in counts] == sorted(d for d, _ in counts)
    assert text.endswith("\n")


def test_the_capacity_progress_bar_stays_on_one_line(
    slots_capacity: tuple[Path, str, str],
) -> None:
    _, _, text = slots_capacity
    assert text.count("\n") == 1


def test_without_dask_the_core_works_and_dask_asks_for_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The core never imports Dask: a fresh interpreter imports simsim and runs a sweep
    # without loading it.
    code = (
        "import sys, simsim, simsim.cli, simsim.sweeps\n"
        "r = simsim.sweep({'workload': {'count': 20, 'rate_per_s': 1.0,"
        " 'prompt_tokens': [16, 64], 'output_tokens': [1, 8]}},"
        " {'workload.rate_per_s': [1.0]}, replications=2, workers=1)\n"
        "assert len(r.runs) == 2\n"
        "assert 'distributed' not in sys.modules and 'dask' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    # --dask without the package: exit 2 and the install hint, nothing run.
    monkeypatch.setitem(sys.modules, "distributed", None)
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    status, _, err = cli_run(capsys, "sweep", str(path), "--out", str(out), "--dask", "local")
    assert status == 2
    assert "pip install 'simsim[dask]'" in err
    assert not out.exists()


def test_an_unreachable_dask_scheduler_exits_2_naming_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unreachable:
        """Stands in for distributed: Client raises what it raises after its timeout."""

        @staticmethod
        def Client(address: str) -> None:
            raise OSError(f"Timed out trying to connect to {address} after 30 s")

    monkeypatch.setitem(sys.modules, "distributed", Unreachable)
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    status, _, err = cli_run(
        capsys, "sweep", str(path), "--out", str(out), "--dask", "tcp://127.0.0.1:1"
    )
    assert status == 2
    assert err == (
        "simsim: error: --dask tcp://127.0.0.1:1: cannot reach a Dask scheduler there "
        "(Timed out trying to connect to tcp://127.0.0.1:1 after 30 s)\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("where", ["base", "scenario file"])
def test_a_sweep_whose_scenario_has_no_backend_is_refused_like_simsim_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    workload = "[workload]\ncount = 5\nrate_per_s = 4.0\nprompt_tokens = 8\noutput_tokens = 2\n"
    if where == "base":
        text = "[sweep]\nreplications = 1\n[base." + workload[1:]
    else:
        write(tmp_path, workload, "scenario.toml")
        text = '[sweep]\nreplications = 1\nscenario = "scenario.toml"\n'
    text += '[grid]\n"workload.rate_per_s" = [2.0]\n'
    path = write(tmp_path, text)
    code, _, err = cli_run(capsys, "sweep", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    assert "backend: missing table" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()
