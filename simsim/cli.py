"""The ``simsim`` command-line tool: run, validate and plot scenarios.

``simsim run [SCENARIO.toml] [--out DIR] [--format csv|parquet] [--seed N]`` runs a
scenario (the built-in default when none is given), prints a summary table and writes
``requests``, ``events``, ``admissions`` and ``summary`` files. ``simsim validate``
checks a scenario file without running it (``--serve``: as ``simsim serve`` reads it).
``simsim sweep SWEEP.toml --out DIR
[--workers N | --dask ADDRESS]`` runs a sweep or capacity search file, writing each
finished run at once so that running it again resumes. ``simsim plot DIR`` draws
figures from a run's or a sweep's results folder. ``simsim compare A B [--out DIR]``
prints how far run B's latencies are from run A's, request by request and by
percentile (``docs/fidelity.md``). ``simsim serve [SCENARIO.toml]``
serves the scenario's server as an OpenAI-compatible HTTP API whose timing comes from
the simulation (``docs/serve.md``). ``simsim replay SCENARIO.toml --url URL --out DIR``
plays a scenario's requests against a real server and writes what it measured, and
``simsim calibrate --url URL --out backend.toml`` probes a server and fits a cost model
to it (``docs/fidelity.md``). Exit status: 0 on success, 1 when a simulation fails (or
a replayed request failed), 2 for a bad scenario, sweep file or arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import pandas as pd

from simsim import __version__
from simsim.admission import ANY_OTHER, QUEUE_FULL, RATE_LIMITED
from simsim.backend import FittedBackendConfig
from simsim.clock import MAX_TIME_US
from simsim.cluster import Cluster, DisaggregatedCluster
from simsim.engines import BatchingEngine
from simsim.engines.base import EngineBase
from simsim.errors import SimulationError
from simsim.request import RequestState
from simsim.results import NO_CLASS, class_summary, summarize
from simsim.run_folder import FORMATS, holds_a_run, write_run_folder
from simsim.scenario import (
    Scenario,
    ScenarioError,
    ScenarioMemoryError,
    Server,
    check_scenario,
    default_scenario,
    default_serve_scenario,
    load_backend,
    load_scenario,
    lost_allocation,
    out_of_memory_while,
    run_scenario,
)
from simsim.sweeps.runner import SweepFolderError
from simsim.sweeps.signals import SweepStopped
from simsim.sweeps.spec import load_sweep
from simsim.sweeps.sweep import RUNS_FILE, SUMMARY_FILE, SweepResult, is_sweep_folder
from simsim.sweeps.sweep_file import CAPACITY_FILE, run_sweep
from simsim.wording import counted

if TYPE_CHECKING:
    from simsim.fidelity.replay import ReplayOptions

__all__ = ["main"]


class ProgressBar:
    """A one-line progress bar on a terminal, shown only once a run takes a moment."""

    def __init__(self, stream: TextIO, label: str, *, delay_s: float = 0.5) -> None:
        self._stream = stream
        self._label = label
        self._delay_s = delay_s
        self._start = time.monotonic()
        self._shown = False
        self._finished = False
        self._enabled = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        elapsed = time.monotonic() - self._start
        if not self._shown and elapsed < self._delay_s and done < total:
            return
        if self._finished or (not self._shown and done >= total):
            return  # already complete, or finished before it was worth showing
        self._shown = True
        fraction = done / total if total else 1.0
        filled = int(30 * fraction)
        bar = "#" * filled + "-" * (30 - filled)
        self._stream.write(f"\r{self._label} [{bar}] {done}/{total} ({elapsed:.1f}s)")
        if done >= total:
            self._stream.write("\n")
            self._finished = True
        self._stream.flush()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simsim",
        description="Simulate an LLM serving engine (simulated costs, not measured hardware).",
    )
    parser.add_argument("--version", action="version", version=f"simsim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a scenario and write its results")
    run.add_argument("scenario", nargs="?", help="a scenario TOML file (default: built-in demo)")
    run.add_argument(
        "--out", default="simsim-results", help="results folder (default: %(default)s)"
    )
    run.add_argument("--format", choices=FORMATS, default="csv", help="file format")
    run.add_argument("--seed", type=int, default=None, help="seed for generated workloads")
    _add_backend_argument(run)

    validate = commands.add_parser("validate", help="check a scenario file without running it")
    validate.add_argument("scenario", help="a scenario TOML file")
    validate.add_argument(
        "--serve",
        action="store_true",
        help="check it as 'simsim serve' reads it (a serving scenario needs no requests)",
    )
    _add_backend_argument(validate)

    sweep = commands.add_parser(
        "sweep", help="run a sweep or capacity search file, resumable, on many processes"
    )
    sweep.add_argument("sweep_file", metavar="SWEEP.toml", help="a sweep file (docs/sweeps.md)")
    sweep.add_argument("--out", required=True, help="results folder; rerun to resume")
    where = sweep.add_mutually_exclusive_group()
    where.add_argument(
        "--workers", type=int, default=None, help="local worker processes (default: one per CPU)"
    )
    where.add_argument(
        "--dask",
        metavar="ADDRESS",
        default=None,
        help="run on a Dask cluster at ADDRESS (needs simsim[dask]); 'local' starts one here",
    )

    serve = commands.add_parser(
        "serve",
        help="serve a scenario's server as an OpenAI-compatible HTTP API, in real time",
        description="Serve the scenario's server (or a built-in batching server) over HTTP: "
        "OpenAI's /v1/completions and /v1/chat/completions, /v1/models, /health and "
        "/metrics, with timing from the simulation (docs/serve.md). Ctrl-C stops it.",
    )
    serve.add_argument(
        "scenario", nargs="?", help="a scenario TOML file (default: a built-in batching server)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    serve.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated seconds per wall second (default: %(default)s; 10 runs 10x faster)",
    )
    _add_backend_argument(serve)
    serve.add_argument("--model", default="simsim", help="the model name served")
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context limit in tokens (default: the KV cache's capacity, else 8192)",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="answer 429 while this many requests wait (default: no limit)",
    )
    serve.add_argument(
        "--retry-after",
        type=int,
        default=1,
        help="Retry-After of a 429 or 503, wall seconds (default: 1)",
    )
    serve.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        help="fraction of valid completion requests answered with --fail-status (default: 0)",
    )
    serve.add_argument(
        "--fail-status", type=int, default=500, help="HTTP status of an injected failure"
    )
    serve.add_argument("--fail-seed", type=int, default=0, help="seed of the failure draws")
    serve.add_argument(
        "--record", metavar="DIR", default=None, help="write the run's tables to DIR on shutdown"
    )
    serve.add_argument(
        "--format", choices=FORMATS, default=None, help="--record's file format (default: csv)"
    )

    _add_replay_parser(commands)
    _add_calibrate_parser(commands)

    plot = commands.add_parser("plot", help="draw PNG figures from a results folder")
    plot.add_argument(
        "results", help="a folder written by 'simsim run', 'simsim sweep' or 'simsim replay'"
    )
    plot.add_argument("--out", default=None, help="where to write the PNGs (default: RESULTS)")

    compare = commands.add_parser(
        "compare",
        help="compare two results folders' latencies (measured against simulated, say)",
        description="Per-request errors |B - A| / A of TTFT, TPOT and E2E, and each "
        "distribution's percentiles, with A the reference (docs/fidelity.md). Two "
        "measurements of one workload give the server's run-to-run noise.",
    )
    compare.add_argument("a", metavar="A_DIR", help="the reference run's results folder")
    compare.add_argument("b", metavar="B_DIR", help="the results folder compared with it")
    compare.add_argument(
        "--out",
        default=None,
        help="write the tables, a JSON summary and figures here (figures need simsim[plot])",
    )
    compare.add_argument(
        "--labels", default=None, metavar="A,B", help="names of the two runs (default: folders')"
    )
    compare.add_argument(
        "--percentiles",
        default="50,90,99",
        metavar="P,P,...",
        help="distribution percentiles to compare (default: %(default)s)",
    )
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)  # for usage errors found after parsing
    return parser


def _check_usage(args: argparse.Namespace) -> None:
    """Refuse option combinations argparse cannot express, as argparse refuses (exit 2)."""
    if args.command == "serve" and args.format is not None and args.record is None:
        args.command_parser.error(
            f"--format {args.format} sets the format of --record's files, and --record is "
            "not given: add --record DIR, or leave --format out"
        )


def _add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend FILE``, as run, validate and serve take it."""
    parser.add_argument(
        "--backend",
        metavar="FILE",
        default=None,
        help="take the [backend] table from FILE (e.g. one simsim calibrate wrote)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simsim`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    _check_usage(args)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "replay":
            return _replay(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "calibrate":
            return _calibrate(args)
        return _plot(args)
    except ScenarioError as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; that is not an error of ours.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except KeyboardInterrupt:
        print("\nsimsim: interrupted", file=sys.stderr)
        return 130
    except MemoryError as error:
        print(f"simsim: error: {_out_of_memory(error)}", file=sys.stderr)
        return 1
    except Exception as error:  # the last line of defence for a CLI user
        if lost_allocation(error):  # a SystemError that lost its MemoryError
            print(f"simsim: error: {_out_of_memory(error)}", file=sys.stderr)
            return 1
        # Every expected problem is reported above or where it happens; this is a bug in
        # simsim. One line still beats a traceback for the user, and names what to report.
        print(
            f"simsim: internal error: {type(error).__name__}: {error} "
            "(a bug in simsim: please report it with the command and files used)",
            file=sys.stderr,
        )
        return 1


def _out_of_memory(error: BaseException) -> str:
    """The out-of-memory line: what the scenario was making, when it is known."""
    if isinstance(error, ScenarioMemoryError):
        return str(error)
    return "out of memory; a smaller scenario, or more memory, is needed"


def _load(args: argparse.Namespace) -> Scenario:
    if args.seed is not None and args.seed < 0:
        raise ScenarioError("--seed", "", f"must be >= 0, got {args.seed}")
    if args.seed is not None and args.seed > MAX_TIME_US:  # as [scenario] seed is
        raise ScenarioError("--seed", "", f"must be at most 2**63 - 1, got {args.seed}")
    backend = getattr(args, "backend", None)
    if args.scenario is None:
        scenario = default_scenario(0 if args.seed is None else args.seed)
        return scenario if backend is None else _with_backend(scenario, backend)
    return load_scenario(args.scenario, seed=args.seed, backend=backend)


def _with_backend(scenario: Scenario, path: str) -> Scenario:
    """*scenario* with the cost model of the ``[backend]`` table in the file at *path*."""
    config = load_backend(path)
    if isinstance(config, FittedBackendConfig) and scenario.engine == "single_slot_fast":
        raise ScenarioError(
            path,
            "backend.kind",
            "a fitted backend prices each decode step from its context; the scenario's "
            'engine "single_slot_fast" cannot use it (use "single_slot")',
        )
    return dataclasses.replace(scenario, backend=config)


def _output_folder(value: str) -> Path:
    """*value* as a results folder, created if missing; a file or unwritable place is refused.

    Checked before anything runs, so a long simulation never ends in a failed write.
    """
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise ScenarioError("--out", "", f"{value} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ScenarioError("--out", "", f"cannot create the folder {value} ({reason})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ScenarioError("--out", "", f"the folder {value} is not writable")
    return out


def _run_output_folder(args: argparse.Namespace) -> Path | None:
    """``--out`` made ready for a run's tables in ``--format``; ``None`` (said why) if not."""
    if args.format == "parquet" and importlib.util.find_spec("pyarrow") is None:
        print(
            f"simsim: error: --format parquet needs pyarrow: {_install('parquet')}",
            file=sys.stderr,
        )
        return None
    out = _output_folder(args.out)
    if is_sweep_folder(out):
        raise ScenarioError(
            "--out", "", f"{out} holds a sweep (it has sweep.json); give another folder"
        )
    return out


def _run(args: argparse.Namespace) -> int:
    scenario = _load(args)
    out = _run_output_folder(args)
    if out is None:
        return 2
    replacing = holds_a_run(out)
    started = time.monotonic()
    try:
        engine = run_scenario(scenario, progress=ProgressBar(sys.stderr, "simulating"))
    except ScenarioError:
        raise  # refused before the run started: a bad file (exit 2), not a failed run
    except (ArithmeticError, ValueError, TypeError, SimulationError) as error:
        # The file was valid but the simulation could not go on (a time past 64 bits,
        # say): report it in one line; the traceback helps nobody using the tool.
        print(
            f"simsim: error: {scenario.source}: the simulation failed: "
            f"{type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return 1
    wall_s = time.monotonic() - started
    with out_of_memory_while(scenario.source, lambda: _building_tables(engine)):
        frames = _write_tables("--out", out, engine, args.format, scenario)
    summary = frames["summary"].set_index("metric")
    if replacing:
        print(f"simsim: replaced the tables of an earlier run in {out}/", file=sys.stderr)
    print(f"scenario {scenario.name!r} ({scenario.source}), seed {scenario.seed}")
    replicas = _replicas(engine)
    server = (
        _batching_lines(replicas, frames["iterations"], frames["events"], frames["requests"])
        if "iterations" in frames
        else []
    )
    if isinstance(engine, Cluster):
        server.extend(_cluster_lines(engine, scenario, frames["requests"], summary["value"]))
    if scenario.scheduler != "fcfs":
        options = ", ".join(f"{key} {value:g}" for key, value in scenario.scheduler_options)
        server.append(f"scheduler     {scenario.scheduler}{f' ({options})' if options else ''}")
    print(_summary_table(summary, frames["requests"], server))
    classes = _class_lines(frames["requests"], scenario.slo_targets())
    if classes:
        print("\n".join(classes))
    events = sum(replica.processed_event_count for replica in replicas)
    print(
        f"{counted(events, 'event')} simulated in {wall_s:.2f} s of wall time; "
        f"results in {out}/ ({args.format})"
    )
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0


def _replicas(engine: Server) -> tuple[EngineBase, ...]:
    """The engines that do the work: a cluster's replicas, or the engine itself."""
    return engine.replicas if isinstance(engine, Cluster) else (engine,)


def _engine_tables(engine: Server) -> dict[str, pd.DataFrame]:
    """The tables a results folder holds for *engine*'s run, the summary included.

    A cluster's tables are its merged frames (a ``replica`` column in each, the replica
    columns in ``requests``); its slots are every replica's, counted per pool for a
    disaggregated cluster (its occupancy rows are per pool too).
    """
    replicas = _replicas(engine)
    frames = {
        "requests": engine.requests_frame(),
        "events": engine.events_frame(),
        "admissions": engine.admissions_frame(),
    }
    if isinstance(engine, BatchingEngine) or (
        isinstance(engine, Cluster) and any(isinstance(r, BatchingEngine) for r in replicas)
    ):
        frames["iterations"] = engine.iterations_frame()
    slots: int | tuple[int, int] = sum(replica.max_active_requests for replica in replicas)
    counts: int | tuple[int, int] | None = None  # so that a replica given nothing counts
    if isinstance(engine, DisaggregatedCluster):
        pools = (engine.prefill_replicas, engine.decode_replicas)
        prefill_slots, decode_slots = (sum(r.max_active_requests for r in pool) for pool in pools)
        slots = (prefill_slots, decode_slots)
        counts = (len(engine.prefill_replicas), len(engine.decode_replicas))
    elif isinstance(engine, Cluster):
        counts = len(replicas)
    summary = summarize(frames["requests"], slots=slots, replicas=counts)
    frames["summary"] = summary.reset_index()
    return frames


def _building_tables(engine: Server) -> str:
    """What :func:`_write_tables` makes of *engine*'s run, for an out-of-memory message:
    the tables of its requests, on its replicas when it is a cluster."""
    what = (
        "building and writing the result tables of "
        f"{counted(len(engine.requests), 'request', grouped=True)}"
    )
    if isinstance(engine, Cluster):
        what += f" on {counted(len(engine.replicas), 'replica', grouped=True)}"
    return what


def _write_tables(
    option: str, out: Path, engine: Server, fmt: Any, scenario: Scenario
) -> dict[str, pd.DataFrame]:
    """Write *engine*'s tables to *out*, stamped with the simulated time it ended at."""
    frames = _engine_tables(engine)
    try:
        write_run_folder(
            out,
            frames,
            format=fmt,
            scenario=scenario.name,
            seed=scenario.seed,
            end_us=engine.env.now,
        )
    except OSError as error:
        reason = error.strerror or str(error)
        where = error.filename or out
        raise ScenarioError(option, "", f"cannot write {where} ({reason})") from None
    return frames


# Each latency row of the run table: its column, its label, whom it covers (the rows
# where the value exists: one such request, several) and why it can be missing.
_LatencyRow = tuple[str, str, tuple[str, str], str]
_LATENCY_ROWS: tuple[_LatencyRow, ...] = (
    (
        "queue_delay_us",
        "queue delay",
        ("admitted request", "admitted requests"),
        "no request was admitted",
    ),
    (
        "ttft_us",
        "TTFT",
        ("request that produced a token", "requests that produced a token"),
        "no request produced a token",
    ),
    (
        "e2e_latency_us",
        "e2e latency",
        ("finished request", "finished requests"),
        "no request finished",
    ),
    (
        "tpot_us",
        "TPOT",
        ("finished request with 2+ tokens", "finished requests with 2+ tokens"),
        "no finished request produced 2+ tokens",
    ),
)


_DECODE_QUEUE_ROW: _LatencyRow = (
    "decode_queue_delay_us",
    "decode queue",
    ("request admitted on a decode replica", "requests admitted on a decode replica"),
    "no request was admitted on a decode replica",
)


def _batching_lines(
    replicas: Sequence[EngineBase],
    iterations: pd.DataFrame,
    events: pd.DataFrame,
    requests: pd.DataFrame,
) -> list[str]:
    """The batching servers' load for a terminal: batch size, preemptions, KV memory.

    Means are over simulated time (each iteration weighs as long as it lasted), so an
    idle stretch between iterations does not count. For a cluster (several *replicas*,
    frames with a ``replica`` column) they are over every replica's iterations, and KV
    memory is each replica's share of its own cache.
    """
    preemptions = int((events["event_type"] == "REQUEST_PREEMPTED").sum())
    ran = iterations[~iterations["abandoned"]]
    weights = (ran["end_us"] - ran["start_us"]).astype("float64")
    head = f"batching      {counted(len(iterations), 'iteration')}"
    preempted = counted(preemptions, "preemption")
    if ran.empty or weights.sum() <= 0:
        return [f"{head}, {preempted}"]
    batch = float((ran["batch_size"] * weights).sum() / weights.sum())
    lines = [f"{head}, {batch:.2f} requests per batch on average, {preempted}"]
    servers = [(i, r) for i, r in enumerate(replicas) if isinstance(r, BatchingEngine)]
    blocks = {i: r.kv_cache.total_blocks for i, r in servers if r.kv_cache is not None}
    if len(replicas) == 1 and blocks:
        total = blocks[0]
        used = float((ran["kv_blocks_in_use"] * weights).sum() / weights.sum())
        peak = int(ran["kv_blocks_in_use"].max())
        lines.append(
            f"KV cache      {used / total:.1%} of {counted(total, 'block')} "
            f"in use on average, {peak / total:.1%} at the peak"
        )
    elif blocks:
        held = ran["kv_blocks_in_use"] / ran["replica"].map(blocks).astype("float64")
        used = float((held * weights).sum() / weights.sum())
        lines.append(
            f"KV cache      {used:.1%} of a replica's blocks in use on average, "
            f"{float(held.max()):.1%} at the peak ({counted(sum(blocks.values()), 'block')} "
            "in all)"
        )
    if any(r.prefix_cache for _, r in servers):
        prompts = int(requests["prompt_token_count"].sum())
        cached = int(requests["cached_prompt_tokens"].sum())
        hit = int((requests["cached_prompt_tokens"] > 0).sum())
        share = f"{cached / prompts:.1%}" if prompts else "n/a (no prompt tokens)"
        lines.append(
            f"prefix cache  {share} of prompt tokens served from the cache; "
            f"{hit} of {counted(len(requests), 'request')} hit it"
        )
    return lines


_REPLICA_LINES = 16
"""A cluster with more replicas prints their spread, not one line each."""


def _cluster_lines(
    cluster: Cluster, scenario: Scenario, requests: pd.DataFrame, summary: pd.Series
) -> list[str]:
    """Per replica: requests routed and finished (handed to decode, on a prefill replica);
    per pool: the spread of the replicas' utilisation."""
    assert scenario.cluster is not None
    lines = [f"cluster       {scenario.cluster.describe()}"]
    finished = requests["state"] == "FINISHED"

    def per_replica(column: str, where: pd.Series | None = None) -> dict[int, int]:
        # One count over the table, not a comparison per replica: fleets are large.
        chosen = requests[column] if where is None else requests[column][where]
        counts = chosen.dropna().astype("int64").value_counts()
        return dict(zip(counts.index.tolist(), counts.tolist(), strict=True))

    rows: list[tuple[str, int, str, int]] = []
    if isinstance(cluster, DisaggregatedCluster):
        count = len(cluster.prefill_replicas)
        prefilled = per_replica("prefill_replica")
        handed = per_replica("prefill_replica", requests["decode_replica"].notna())
        decoded = per_replica("decode_replica")
        done = per_replica("decode_replica", finished)
        for index in range(len(cluster.replicas)):
            if index < count:
                routed = prefilled.get(index, 0)
                rows.append(("prefill ", routed, "handed to decode", handed.get(index, 0)))
            else:
                routed = decoded.get(index, 0)
                rows.append(("decode ", routed, "finished", done.get(index, 0)))
    else:
        routed_to, done = per_replica("replica"), per_replica("replica", finished)
        for index in range(len(cluster.replicas)):
            rows.append(("", routed_to.get(index, 0), "finished", done.get(index, 0)))
    if len(rows) <= _REPLICA_LINES:
        lines.extend(
            f"{f'replica {i}':<14}{role}{routed} routed, {done} {what}"
            for i, (role, routed, what, done) in enumerate(rows)
        )
    else:
        lines.extend(_replica_spread(rows))
    pools = ("prefill_", "decode_") if isinstance(cluster, DisaggregatedCluster) else ("",)
    for pool in pools:
        low = summary.get(f"{pool}replica_utilization_min")
        high = summary.get(f"{pool}replica_utilization_max")
        imbalance = summary.get(f"{pool}replica_load_imbalance")
        if low is None or high is None or pd.isna(low) or pd.isna(high):
            continue
        who = pool.replace("_", " ")
        if summary.get(f"{pool}replicas") == 1:  # nothing to balance: how busy it was
            lines.append(f"{'balance':<14}{who}replica busy {low:.1%} of the time (the only one)")
            continue
        lines.append(
            f"{'balance':<14}{who}replicas busy {low:.1%} to {high:.1%} "
            f"of the time; busiest got {imbalance:.2f}x its fair share of requests"
        )
    if "transfer_us" in requests:
        moved = requests["transfer_us"].dropna()
        if len(moved):
            lines.append(
                f"KV transfer   {counted(len(moved), 'transfer')}, "
                f"mean {_duration(float(moved.mean()))}, "
                f"max {_duration(float(moved.max()))}"
            )
    return lines


def _replica_spread(rows: Sequence[tuple[str, int, str, int]]) -> list[str]:
    """One line per pool: the fewest and most requests a replica was routed and finished."""
    lines = []
    for role in dict.fromkeys(row[0] for row in rows):
        pool = [row for row in rows if row[0] == role]
        routed = [row[1] for row in pool]
        done = [row[3] for row in pool]
        lines.append(
            f"{'per replica':<14}{role}{min(routed)} to {max(routed)} routed, "
            f"{min(done)} to {max(done)} {pool[0][2]} ({counted(len(pool), 'replica')})"
        )
    return lines


def _summary_table(
    summary: pd.DataFrame, requests: pd.DataFrame, server: Sequence[str] = ()
) -> str:
    """The run's summary for a terminal: no NaN, every time in ms or s, who each row covers."""
    values = summary["value"]
    lines = [f"requests      {values['requests']:.0f}{_request_counts(values)}"]
    makespan = values["makespan_us"]
    if pd.isna(makespan):
        lines.append("makespan      n/a (no request finished or was cancelled)")
    else:
        lines.append(f"makespan      {_duration(makespan)} (first arrival to last end)")
    if pd.isna(values["throughput_requests_per_s"]):
        why = "no makespan" if pd.isna(makespan) else f"the makespan is {_duration(makespan)}"
        lines.append(f"throughput    n/a ({why})")
    else:
        lines.append(
            f"throughput    {values['throughput_requests_per_s']:.2f} requests/s, "
            f"{values['throughput_tokens_per_s']:.1f} tokens/s"
        )
    lines.extend(_occupancy_lines(values))
    lines.extend(server)
    stats = ("mean", "p50", "p90", "p99")
    lines.append(f"{'':14}{''.join(f'{stat:>12}' for stat in stats)}   over")
    latency_rows = _LATENCY_ROWS
    if "decode_queue_delay_us" in requests.columns:  # disaggregated: a queue per pool
        queue, *others = _LATENCY_ROWS
        latency_rows = (("queue_delay_us", "prefill queue", *queue[2:]), _DECODE_QUEUE_ROW, *others)
    for column, label, covers, why_missing in latency_rows:
        present = int(requests[column].notna().sum())
        if present == 0:
            lines.append(f"{label:<14}n/a ({why_missing})")
            continue
        cells = "".join(f"{_duration(values[f'{column}_{stat}']):>12}" for stat in stats)
        lines.append(f"{label:<14}{cells}   {counted(present, *covers)}")
    return "\n".join(lines)


# How the requests line says why an admission control rejected a request.
_REJECTIONS = {RATE_LIMITED: "rate-limited", QUEUE_FULL: "with the queue full"}


def _request_counts(values: pd.Series) -> str:
    """The requests by state, in words: ``" (finished 90, cancelled 10, of which 6
    rejected: 4 rate-limited, 2 with the queue full)"``; states no request ended in are
    left out, and so is the rejection part without an admission control or a rejection
    (a rejected request ends cancelled, so it is told as a part of the cancelled)."""
    states = []
    for name in values.index:
        state = name.removeprefix("count_")
        if name == state or not state.isupper() or values[name] <= 0:
            continue
        words = f"{state.lower()} {values[name]:.0f}"
        if state == RequestState.CANCELLED.name and values.get("count_rejected", 0) > 0:
            reasons = [
                f"{values[f'count_rejected_{reason}']:.0f} {said}"
                for reason, said in _REJECTIONS.items()
                if values[f"count_rejected_{reason}"] > 0
            ]
            words += f", of which {values['count_rejected']:.0f} rejected: {', '.join(reasons)}"
        states.append(words)
    return f" ({', '.join(states)})" if states else ""


def _occupancy_lines(values: pd.Series) -> list[str]:
    """The occupancy rows of the summary (if it has them) for a terminal: the whole
    server's or cluster's, or, for a disaggregated cluster, one line per pool."""
    pools = [p for p in ("prefill_", "decode_") if f"{p}utilization" in values.index] or [""]
    if f"{pools[0]}utilization" not in values.index:
        return []
    lines = []
    for pool in pools:
        label = f"occupancy     {pool.replace('_', ' ')}"
        if pd.isna(values[f"{pool}utilization"]):
            lines.append(f"{label}n/a (no makespan)")
        else:
            lines.append(
                f"{label}{values[f'{pool}utilization']:.1%} of slot time busy, "
                f"{values[f'{pool}mean_active_requests']:.2f} requests in slots and "
                f"{values[f'{pool}mean_queue_length']:.2f} queued on average"
            )
    return lines


def _class_lines(
    requests: pd.DataFrame, targets: Mapping[str, tuple[float | None, float | None]]
) -> list[str]:
    """One line per request class (or, with no classes, per tenant), from
    :func:`~simsim.results.class_summary`: its requests (and how many an admission
    control rejected), TTFT percentiles, p99 end-to-end latency, and the share of its
    requests that finished within its own SLO targets (*targets*: class -> (TTFT, TPOT)
    in us; rejected and cancelled requests count as missed). Nothing when the requests
    have neither."""
    by = next(
        (
            name
            for name in ("request_class", "tenant")
            if name in requests.columns and requests[name].notna().any()
        ),
        None,
    )
    if by is None:
        return []
    table = class_summary(requests, by, slo=targets if by == "request_class" else None)
    keys = requests[by].astype("object").where(requests[by].notna(), NO_CLASS)
    rejections = "rejection" in requests.columns  # an admission control ran
    width = max(14, *(len(str(name)) + 2 for name in table.columns))
    noun = "class" if by == "request_class" else "tenant"
    rejected_head = f"{'rejected':>10}" if rejections else ""
    head = f"{'per ' + noun:<{width}}{'requests':>9}{rejected_head}"
    lines = [f"{head}{'p50 TTFT':>12}{'p99 TTFT':>12}{'p99 e2e':>12}   SLO attained"]
    for name in table.columns:
        values = table[name]
        rejected = ""
        if rejections:
            rejected = f"{int(requests['rejection'][keys == name].notna().sum()):>10}"
        cells = "".join(
            f"{'n/a' if pd.isna(values[key]) else _duration(values[key]):>12}"
            for key in ("ttft_us_p50", "ttft_us_p99", "e2e_latency_us_p99")
        )
        ttft_slo, tpot_slo = (
            targets.get(name, (None, None)) if by == "request_class" else (None, None)
        )
        goals = [
            f"{label} {_duration(target)}"
            for label, target in (("TTFT", ttft_slo), ("TPOT", tpot_slo))
            if target is not None
        ]
        attained = (
            f"{values['slo_attainment']:.1%} (within {', '.join(goals)})"
            if goals
            else "n/a (no target)"
        )
        lines.append(f"{name:<{width}}{values['requests']:>9.0f}{rejected}{cells}   {attained}")
    return lines


def _duration(value_us: float) -> str:
    """A simulated duration for people: ms below 10 s, s above; never scientific notation."""
    ms = float(value_us) / 1000
    if abs(ms) >= 10_000:
        return f"{ms / 1000:,.1f} s"
    if ms == 0 or abs(ms) >= 1:
        return f"{ms:.1f} ms"
    return f"{ms:.3f} ms"


def _install(extra: str) -> str:
    """How to install an optional extra, from the package index or a source checkout."""
    return f"pip install 'simsim[{extra}]' (from a source checkout: pip install '.[{extra}]')"


def _validate(args: argparse.Namespace) -> int:
    if args.serve:
        scenario = _serving_scenario(args.scenario, args.backend)
        scenario.build_engine()  # what serve builds (the fast engine's options are the same)
        for note in _serve_notes(scenario):
            print(note, file=sys.stderr)
        print(
            f"{args.scenario}: ok: scenario {scenario.name!r}, engine {scenario.engine}, "
            "served over HTTP (the clients send the requests)"
        )
        return 0
    scenario = load_scenario(args.scenario, require_requests=False, backend=args.backend)
    if not scenario.requests and scenario.workload is None:
        raise ScenarioError(
            scenario.source,
            "",
            "the scenario has no requests: add [[requests]], [trace] or [workload] to run "
            "it; a serving scenario (simsim serve: its clients send the requests) is "
            f"checked with: simsim validate {args.scenario} --serve",
        )
    # Submit every request to the engine (without running it): what run would refuse.
    requests = check_scenario(scenario)
    print(
        f"{args.scenario}: ok: scenario {scenario.name!r}, engine {scenario.engine}, "
        f"{'' if scenario.cluster is None else f'cluster of {scenario.cluster.describe()}, '}"
        f"{counted(len(requests), 'request')}, "
        f"{counted(len(scenario.cancellations), 'cancellation')}"
    )
    return 0


# ServeOptions' fields and the options that set them, for error messages.
_SERVE_OPTIONS = {
    "model": "--model",
    "max_model_len": "--max-model-len",
    "max_waiting": "--max-waiting",
    "retry_after_s": "--retry-after",
    "fail_rate": "--fail-rate",
    "fail_status": "--fail-status",
    "fail_seed": "--fail-seed",
}


class _Terminated(Exception):
    """SIGTERM reached ``simsim serve`` after uvicorn's clean shutdown."""


def _serve(args: argparse.Namespace) -> int:
    missing = [
        name
        for name in ("starlette", "uvicorn", "prometheus_client")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        print(
            f"simsim: error: serve needs {', '.join(missing)}: {_install('serve')}",
            file=sys.stderr,
        )
        return 2
    from simsim.live import LiveServer, ServeOptions, serving_engine
    from simsim.live.wire import OptionError

    scenario = _serving_scenario(args.scenario, args.backend)
    if not (math.isfinite(args.speed) and args.speed > 0):
        raise ScenarioError("--speed", "", f"must be a positive number, got {args.speed}")
    if not 0 <= args.port <= 65535:
        raise ScenarioError("--port", "", f"must be 0 to 65535, got {args.port}")
    fmt = "csv" if args.format is None else args.format
    if args.record is not None and fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        print(
            f"simsim: error: --record with --format parquet needs pyarrow: {_install('parquet')}",
            file=sys.stderr,
        )
        return 2
    engine = serving_engine(scenario)
    try:
        options = ServeOptions(
            model=args.model,
            max_model_len=args.max_model_len,
            max_waiting=args.max_waiting,
            retry_after_s=args.retry_after,
            fail_rate=args.fail_rate,
            fail_status=args.fail_status,
            fail_seed=args.fail_seed,
        )
    except OptionError as error:  # it names its field; the user typed the option
        raise ScenarioError(_SERVE_OPTIONS.get(error.field, error.field), "", error.rule) from None
    try:
        server = LiveServer(
            engine, speed=args.speed, options=options, host=args.host, port=args.port
        )
    except OSError as error:
        reason = error.strerror or str(error)
        print(
            f"simsim: error: cannot listen on {args.host}:{args.port} ({reason})", file=sys.stderr
        )
        return 1
    try:
        out = _record_folder(args.record)
    except ScenarioError:
        server.stop()
        raise
    for note in _serve_notes(scenario):
        print(note, file=sys.stderr)
    print(
        f"simsim serve: model {options.model!r} ({scenario.name}, engine "
        f"{type(engine).__name__}) on {server.base_url} at speed {args.speed:g}; "
        "times are simulated, not measured. Ctrl-C stops.",
        flush=True,
    )
    # Everything built so far lives as long as the server: out of the collector's way, so
    # a full collection never stalls the stream of tokens (one took 25 ms in a benchmark).
    gc.collect()
    gc.freeze()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        server.run()
    except (KeyboardInterrupt, _Terminated):
        pass  # uvicorn has shut down cleanly; it re-raises the signal that stopped it
    finally:
        signal.signal(signal.SIGTERM, previous)
    requests = engine.requests_frame()
    states = requests["state"].value_counts()
    finished, cancelled = states.get("FINISHED", 0), states.get("CANCELLED", 0)
    rejected = ""
    if "rejection" in requests:  # turned away by [admission]: answered 429, counted cancelled
        rejected = f" of which {int(requests['rejection'].notna().sum())} rejected"
    print(
        f"served {counted(len(requests), 'request')} ({finished} finished, {cancelled} "
        f"cancelled{rejected}, {len(requests) - finished - cancelled} unfinished) in "
        f"{engine.env.now / 1e6:.3f} simulated seconds"
    )
    if out is not None:
        with out_of_memory_while(scenario.source, lambda: _building_tables(engine)):
            _write_tables("--record", out, engine, fmt, scenario)
        print(f"results in {out}/ ({fmt}); plot them with: simsim plot {out}")
    return 0


def _serving_scenario(path: str | None, backend: str | None) -> Scenario:
    """The scenario ``simsim serve`` serves: the file at *path* (which needs no requests)
    or the built-in server, with *backend*'s costs if given; a ``[cluster]`` is refused."""
    if path is None:
        scenario = default_serve_scenario()
        if backend is not None:
            scenario = _with_backend(scenario, backend)
    else:
        scenario = load_scenario(path, require_requests=False, backend=backend)
    if scenario.cluster is not None:
        raise ScenarioError(
            scenario.source,
            "cluster",
            f"simsim serve serves one server, and the file describes a cluster "
            f"({scenario.cluster.describe()}); remove [cluster] to serve one replica "
            "(simsim run and simsim sweep simulate the cluster)",
        )
    return scenario


def _serve_notes(scenario: Scenario) -> list[str]:
    """What ``simsim serve`` does differently from the file's words, one line each."""
    notes = []
    if scenario.engine == "single_slot_fast":
        notes.append(
            "simsim: serving engine single_slot: single_slot_fast has no per-token steps to "
            "stream (same request table)"
        )
    unused = [
        part
        for part, present in (
            ("requests", bool(scenario.requests)),
            ("workload", scenario.workload is not None),
            ("cancellations", bool(scenario.cancellations)),
        )
        if present
    ]
    if unused:
        notes.append(
            f"simsim: ignoring {scenario.source}'s {' and '.join(unused)}: the clients send "
            "the requests"
        )
    if scenario.batching is not None and scenario.batching.prefix_cache:
        notes.append(
            "simsim: note: [prefix_cache] never hits over HTTP: served requests carry no KV "
            "block hashes (prompts are not hashed into blocks yet), so every prompt is "
            "prefilled in full"
        )
    admission = scenario.admission
    if admission is not None and set(admission.limits) - {ANY_OTHER}:
        names = ", ".join(repr(name) for name in admission.limits if name != ANY_OTHER)
        star = (
            f"only the {ANY_OTHER!r} limit does"
            if ANY_OTHER in admission.limits
            else f"only a {ANY_OTHER!r} limit would"
        )
        notes.append(
            f"simsim: note: served requests carry no {admission.key} name, so the admission "
            f"limits for {names} never apply to them ({star})"
        )
    return notes


def _record_folder(value: str | None) -> Path | None:
    """``--record``'s folder, created (after every other option was accepted)."""
    if value is None:
        return None
    try:
        out = _output_folder(value)
    except ScenarioError as error:  # it names --out, the option of 'simsim run'
        raise ScenarioError("--record", "", error.rule) from None
    if is_sweep_folder(out):
        raise ScenarioError(
            "--record", "", f"{out} holds a sweep (it has sweep.json); give another folder"
        )
    return out


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def _add_replay_parser(commands: Any) -> None:
    replay = commands.add_parser(
        "replay",
        help="play a scenario's requests against a real OpenAI-compatible server and measure",
        description="Send the scenario's requests to URL/v1/completions at their arrival "
        "times (real time, open loop, streamed, cancelled on schedule) and write what was "
        "measured as a results folder (docs/fidelity.md).",
    )
    replay.add_argument("scenario", help="a scenario TOML file (open-loop requests)")
    replay.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    replay.add_argument("--out", required=True, help="the measured results folder")
    replay.add_argument("--format", choices=FORMATS, default="csv", help="file format")
    replay.add_argument("--seed", type=int, default=None, help="seed for generated workloads")
    _add_client_arguments(replay)


def _add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The request options ``simsim replay`` and ``simsim calibrate`` share."""
    parser.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    parser.add_argument(
        "--token-ids",
        metavar="LOW-HIGH",
        default="3-1002",
        help="prompt token ids drawn from LOW to HIGH, both included (default: %(default)s)",
    )
    parser.add_argument(
        "--prompt-seed", type=int, default=None, help="seed of the prompt ids (default: fresh)"
    )
    parser.add_argument(
        "--ban-tokens", metavar="IDS", default="", help="comma-separated ids given logit_bias -100"
    )
    parser.add_argument(
        "--extra-body",
        metavar="JSON",
        default="{}",
        help="more request fields, e.g. '{\"cache_prompt\": false}' for llama.cpp",
    )
    parser.add_argument(
        "--no-exact-output",
        action="store_true",
        help="do not send ignore_eos and min_tokens (for a server that refuses them)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait to connect or for the next chunk (default: %(default)s)",
    )


def _add_calibrate_parser(commands: Any) -> None:
    calibrate = commands.add_parser(
        "calibrate",
        help="probe a real OpenAI-compatible server and fit a [backend] table to it",
        description="Send probes (prompt lengths x output lengths x concurrency levels, "
        "repeated) to URL/v1/completions one at a time, fit the fitted cost model by "
        "non-negative least squares, print the fit quality and write a [backend] table "
        "a scenario can use (docs/fidelity.md).",
    )
    calibrate.add_argument("--url", default=None, help="the server, e.g. http://127.0.0.1:8080")
    calibrate.add_argument("--out", required=True, help="the backend TOML file to write")
    calibrate.add_argument(
        "--engine",
        choices=("single_slot", "batching"),
        default="single_slot",
        help="the simsim server the model is for (default: %(default)s)",
    )
    calibrate.add_argument(
        "--prompts",
        metavar="N,N,...",
        default=None,
        help="prompt lengths to probe (default: 16,64,256,512,1024, or the workload's)",
    )
    calibrate.add_argument(
        "--outputs",
        metavar="N,N,...",
        default=None,
        help="output lengths to probe, more than 8 (default: 64, or the workload's)",
    )
    calibrate.add_argument(
        "--concurrency",
        metavar="N,N,...",
        default=None,
        help="requests sent together per probe (default: 1; batching: 1,2,4)",
    )
    calibrate.add_argument(
        "--repeats", type=int, default=3, help="times each probe runs (default: %(default)s)"
    )
    calibrate.add_argument(
        "--workload",
        metavar="SCENARIO",
        default=None,
        help="probe the prompt and output lengths (and slots) of this scenario's requests",
    )
    calibrate.add_argument(
        "--probes-out", metavar="CSV", default=None, help="also save the probes table here"
    )
    calibrate.add_argument(
        "--measured",
        metavar="DIR",
        action="append",
        default=None,
        help="fit decode steps to this replayed workload's token gaps instead of the "
        "probes' (a folder simsim replay wrote; may be repeated)",
    )
    calibrate.add_argument(
        "--from-probes",
        metavar="CSV",
        default=None,
        help="fit a saved probes table instead of probing a server (no --url)",
    )
    _add_client_arguments(calibrate)


def _replay(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("httpx") is None:
        print(f"simsim: error: replay needs httpx: {_install('fidelity')}", file=sys.stderr)
        return 2
    from simsim.fidelity import replay

    if args.seed is not None and args.seed < 0:
        raise ScenarioError("--seed", "", f"must be >= 0, got {args.seed}")
    if args.seed is not None and args.seed > MAX_TIME_US:  # as [scenario] seed is
        raise ScenarioError("--seed", "", f"must be at most 2**63 - 1, got {args.seed}")
    # The server measured is the cost model: the file needs no [backend] table.
    scenario = load_scenario(args.scenario, seed=args.seed, require_backend=False)
    replay.planned_requests(scenario)  # a closed-loop workload is refused before anything
    options = _replay_options(args)
    _check_url(args.url)
    out = _run_output_folder(args)
    if out is None:
        return 2
    try:
        run = replay.replay_scenario(
            scenario,
            args.url,
            model=args.model,
            options=options,
            progress=ProgressBar(sys.stderr, "replaying"),
        )
    except replay.ReplayError as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 1
    try:
        run.write(out, format=args.format)
    except OSError as error:
        raise ScenarioError("--out", "", f"cannot write {error.filename or out}") from None
    print(replay.replay_report(run))
    print(f"results in {out}/ ({args.format}): requests, tokens, summary, run.json")
    return 1 if (run.requests["state"] == "FAILED").any() else 0


def _check_url(url: str) -> None:
    """*url* as a server's root, or exit 2 naming ``--url`` (needs httpx: checked first)."""
    from simsim.fidelity.replay import server_root

    try:
        server_root(url)
    except ValueError as error:
        raise ScenarioError("--url", "", str(error)) from None


def _replay_options(args: argparse.Namespace) -> ReplayOptions:
    """The ``ReplayOptions`` the replay flags ask for; a bad flag is named (exit 2)."""
    from simsim.fidelity.replay import ReplayOptionError, ReplayOptions

    low, _, high = args.token_ids.partition("-")
    try:
        token_ids = (int(low), int(high))
    except ValueError:
        raise ScenarioError(
            "--token-ids", "", f"must be LOW-HIGH, two token ids, got {args.token_ids!r}"
        ) from None
    try:
        bans = tuple(int(part) for part in args.ban_tokens.split(",") if part.strip())
    except ValueError:
        raise ScenarioError(
            "--ban-tokens", "", f"must be comma-separated token ids, got {args.ban_tokens!r}"
        ) from None
    try:
        extra = json.loads(args.extra_body)
    except ValueError as error:
        raise ScenarioError("--extra-body", "", f"is not JSON ({error})") from None
    flags = {
        "token_ids": "--token-ids",
        "prompt_seed": "--prompt-seed",
        "ban_tokens": "--ban-tokens",
        "extra_body": "--extra-body",
        "timeout_s": "--timeout",
    }
    try:
        return ReplayOptions(
            token_ids=token_ids,
            prompt_seed=args.prompt_seed,
            ban_tokens=bans,
            extra_body=extra,
            timeout_s=args.timeout,
            exact_output=not args.no_exact_output,
        )
    except ReplayOptionError as error:  # it names its field; the user typed the flag
        raise ScenarioError(flags.get(error.field, error.field), "", error.rule) from None


def _calibrate(args: argparse.Namespace) -> int:
    from simsim.fidelity import calibrate

    if (args.url is None) == (args.from_probes is None):
        raise ScenarioError("--url", "", "give either --url (probe a server) or --from-probes")
    out = Path(args.out)
    if out.is_dir():
        raise ScenarioError("--out", "", f"{out} is a folder; give the TOML file to write")
    if args.from_probes is not None:
        try:
            probes = calibrate.probes_frame(pd.read_csv(args.from_probes, keep_default_na=False))
        except (OSError, ValueError) as error:
            raise ScenarioError("--from-probes", "", f"{args.from_probes}: {error}") from None
        source = None
    else:
        if importlib.util.find_spec("httpx") is None:
            print(f"simsim: error: calibrate needs httpx: {_install('fidelity')}", file=sys.stderr)
            return 2
        from simsim.fidelity import replay

        _check_url(args.url)
        plan = _calibration_plan(args, calibrate)
        options = _replay_options(args)
        print(f"probing {args.url}: {counted(len(plan), 'probe')}", file=sys.stderr)
        try:
            probes = calibrate.run_probes(
                args.url,
                plan,
                model=args.model,
                options=options,
                progress=ProgressBar(sys.stderr, "probing"),
            )
        except replay.ReplayError as error:
            print(f"simsim: error: {error}", file=sys.stderr)
            return 1
        if args.probes_out is not None:
            probes.to_csv(args.probes_out, index=False)
        failed = probes[probes["error"] != ""]
        if len(failed):
            first = failed.iloc[0]
            print(
                f"simsim: warning: {len(failed)} of {counted(len(probes), 'probe request')} "
                "failed "
                f"(left out of the fit); the first: {first['error']}",
                file=sys.stderr,
            )
        source = args.url
    decode = None
    if args.measured:
        decode = pd.concat(
            [_measured_decode(folder, calibrate) for folder in args.measured], ignore_index=True
        )
    try:
        calibration = calibrate.fit_backend(probes, args.engine, decode=decode)
    except ValueError as error:
        print(f"simsim: error: cannot fit: {error}", file=sys.stderr)
        return 1
    print(calibration.report())
    try:
        out.write_text(
            calibrate.backend_toml(calibration, url=source, model=args.model), encoding="utf-8"
        )
    except OSError as error:
        raise ScenarioError("--out", "", f"cannot write {out} ({error.strerror})") from None
    print(f"wrote {out}: use it with simsim run SCENARIO --backend {out}")
    return 0


def _measured_decode(folder: str, calibrate: Any) -> pd.DataFrame:
    """The pure decode steps of the measured run in *folder*; a bad folder exits 2."""
    from simsim.run_folder import read_run_folder

    if not Path(folder).is_dir():
        raise ScenarioError(
            "--measured", "", f"{folder}: no such folder (simsim replay --out writes one)"
        )
    try:
        run = read_run_folder(folder)
        if not run.measured:
            raise ValueError("it holds a simulation, not a measurement (simsim replay writes one)")
        observations: pd.DataFrame = calibrate.measured_decode_observations(
            run.requests(), run.table("tokens")
        )
        return observations
    except (OSError, ValueError) as error:
        raise ScenarioError("--measured", "", f"{folder}: {error}") from None


def _calibration_plan(args: argparse.Namespace, calibrate: Any) -> list[Any]:
    """The probes the flags (and ``--workload``) ask for; a bad list is named (exit 2)."""
    prompts, outputs, levels = [16, 64, 256, 512, 1024], [64], [1]
    if args.engine == "batching":
        levels = [1, 2, 4]
    if args.workload is not None:
        workload = load_scenario(args.workload, require_backend=False)
        try:
            prompts, outputs, slots = calibrate.workload_ranges(workload)
        except ValueError as error:
            raise ScenarioError("--workload", "", str(error)) from None
        if args.engine == "batching":
            levels = sorted({level for level in (1, 2, 4, 8, 16, 32) if level <= slots} | {slots})
    prompts = _int_list(args.prompts, "--prompts", prompts)
    outputs = _int_list(args.outputs, "--outputs", outputs)
    levels = _int_list(args.concurrency, "--concurrency", levels)
    if len(set(prompts)) < 2:
        raise ScenarioError(
            "--prompts",
            "",
            f"needs at least two prompt lengths, to see how the prefill grows with the "
            f"prompt; got {prompts}",
        )
    if args.engine == "batching" and len(set(levels)) < 2:
        raise ScenarioError(
            "--concurrency",
            "",
            f"needs at least two levels for a batching server, to tell a step's cost per "
            f"sequence from its base; got {levels}",
        )
    if args.engine == "single_slot" and max(levels) > 1:
        raise ScenarioError(
            "--concurrency",
            "",
            f"sends up to {max(levels)} requests at once, which measures a batching server: "
            "add --engine batching (a single slot is probed one request at a time)",
        )
    too_short = [n for n in outputs if n <= calibrate.GAP_WINDOW]
    if too_short:
        raise ScenarioError(
            "--outputs",
            "",
            f"must be more than {calibrate.GAP_WINDOW} tokens (decode steps are measured "
            f"from the gaps between tokens), got {too_short}",
        )
    try:
        return list(
            calibrate.probe_plan(
                prompts=prompts, outputs=outputs, concurrency=levels, repeats=args.repeats
            )
        )
    except ValueError as error:
        raise ScenarioError("--repeats", "", str(error)) from None


def _int_list(value: str | None, flag: str, default: list[int]) -> list[int]:
    if value is None:
        return default
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise ScenarioError(
            flag, "", f"must be positive integers separated by commas, got {value!r}"
        )
    return numbers


def _sweep(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", "", f"must be >= 1, got {args.workers}")
    spec = load_sweep(args.sweep_file)
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        executor = None
        if args.dask is not None:
            executor = _dask_executor(args.dask, stack)
            if executor is None:
                return 2
        _output_folder(args.out)  # a file or an unmakeable folder exits 2 before any run
        kind = "capacity search" if spec.capacity else "sweep"
        try:
            result, capacity = run_sweep(
                spec,
                out=out,
                executor=executor,
                workers=args.workers,
                progress=ProgressBar(sys.stderr, kind),
            )
        except SweepFolderError as error:
            print(f"simsim: error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as error:
            # SIGTERM and SIGHUP stop a sweep as Ctrl-C does, with their own exit status.
            why, status = (
                (str(error), error.exit_status)
                if isinstance(error, SweepStopped)
                else ("interrupted", 130)
            )
            print(
                f"\nsimsim: {why}; finished runs are kept in {out}/: "
                "run the same command again to resume",
                file=sys.stderr,
            )
            return status
        except (ArithmeticError, ValueError, TypeError, SimulationError) as error:
            print(
                f"simsim: error: {args.sweep_file}: {type(error).__name__}: {error}",
                file=sys.stderr,
            )
            for note in getattr(error, "__notes__", []):
                print(f"simsim: {note}", file=sys.stderr)
            return 1
    if result.reused:
        kept = counted(result.reused, "finished run")
        verb = "was" if result.reused == 1 else "were"
        print(f"resumed: {kept} in {out}/ {verb} kept, not run again")
    print(_sweep_report(result, capacity))
    tables = f"{RUNS_FILE}, {SUMMARY_FILE}" + (f", {CAPACITY_FILE}" if capacity is not None else "")
    print(f"results in {out}/: {tables}")
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0


def _dask_executor(address: str, stack: contextlib.ExitStack) -> Executor | None:
    """A Dask executor for *address* ('local' starts a cluster here), closed by *stack*."""
    try:
        # Imported by name: Dask is an optional extra, and untyped.
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        print(
            f"simsim: error: --dask needs Dask's distributed package: {_install('dask')}",
            file=sys.stderr,
        )
        return None
    if address == "local":
        cluster = stack.enter_context(
            distributed.LocalCluster(processes=True, threads_per_worker=1, dashboard_address=None)
        )
        client = stack.enter_context(distributed.Client(cluster))
    else:
        client = stack.enter_context(distributed.Client(address))
    executor: Executor = client.get_executor()
    return executor


def _sweep_report(result: SweepResult, capacity: pd.DataFrame | None) -> str:
    """A short text report: capacity per configuration, or key metrics per point."""
    if capacity is not None:
        lines = []
        for row in capacity.to_dict("records"):
            low, high, value = (_number(row[k]) for k in ("interval_low", "interval_high", "value"))
            lines.append(
                f"{row['configuration']}: {row['find']} {row['parameter']} = "
                f"{'none in range' if value == '-' else value} "
                f"({row['status']}; capacity within [{low}, {high}], {row['runs']} runs)"
            )
        return "\n".join(lines)
    keys = [c for c in ("case", *result.axes) if c in result.runs.columns]
    summary = result.summary
    points = summary.drop_duplicates(subset="point")[["point", *keys]]
    shown = pd.DataFrame(index=pd.MultiIndex.from_frame(points))
    for metric, (title, show) in _SWEEP_COLUMNS.items():
        means = summary[summary["metric"] == metric].set_index("point")["mean"]
        if len(means):
            shown[title] = [
                "n/a" if pd.isna(value) else show(value) for value in points["point"].map(means)
            ]
    note = ""
    if (shown == "n/a").any().any():
        note = "\nn/a: no run of that point had the metric (no request produced a token, say)"
    return (
        f"{counted(result.runs['point'].nunique(), 'point')} x "
        f"{counted(result.replications, 'replication')} "
        f"(means over replications):\n{shown.to_string()}{note}"
    )


# The sweep report's metric columns: title and how a value is shown.
_SWEEP_COLUMNS: dict[str, tuple[str, Callable[[float], str]]] = {
    "ttft_us_p99": ("TTFT p99", _duration),
    "e2e_latency_us_p99": ("e2e latency p99", _duration),
    "throughput_tokens_per_s": ("tokens/s", lambda v: f"{v:,.1f}"),
}


def _number(value: Any) -> str:
    """A number for a report (``:g``, but never in scientific notation), ``-`` if missing."""
    if value is None or pd.isna(value):
        return "-"
    text = f"{value:g}"
    return np.format_float_positional(value, trim="-") if "e" in text else text


def _plot(args: argparse.Namespace) -> int:
    try:
        from simsim import plots
    except ImportError as error:
        if not (error.name or "").split(".")[0] == "matplotlib":
            raise
        print(
            f"simsim: error: plotting needs matplotlib, which is not installed: {_install('plot')}",
            file=sys.stderr,
        )
        return 2
    try:
        results, target = Path(args.results), _output_folder(args.out) if args.out else None
        if is_sweep_folder(results):
            written = plots.plot_sweep(results, target)
        else:
            written = plots.plot_results(results, target)
    except (OSError, ValueError, ImportError) as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from simsim.fidelity.compare import compare_runs

    if args.out is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            "simsim: error: compare --out draws figures, which needs matplotlib: "
            f"{_install('plot')}",
            file=sys.stderr,
        )
        return 2
    labels = None
    if args.labels is not None:
        names = args.labels.split(",")
        if len(names) != 2 or not all(name.strip() for name in names):
            raise ScenarioError(
                "--labels", "", f"must be two names separated by a comma, got {args.labels!r}"
            )
        labels = (names[0].strip(), names[1].strip())
    try:
        percentiles = [float(value) for value in args.percentiles.split(",")]
    except ValueError:
        raise ScenarioError(
            "--percentiles",
            "",
            f"must be numbers separated by commas (50,90,99), got {args.percentiles!r}",
        ) from None
    out = _output_folder(args.out) if args.out is not None else None
    if Path(args.a).resolve() == Path(args.b).resolve():
        print(
            f"simsim: warning: A and B are the same folder ({args.a}): every error is 0",
            file=sys.stderr,
        )
    try:
        comparison = compare_runs(args.a, args.b, percentiles=percentiles, labels=labels)
    except (OSError, ValueError, ImportError) as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 2
    print(comparison.table())
    if comparison.request_counts["different_sizes"]:
        print(
            "simsim: warning: "
            f"{counted(comparison.request_counts['different_sizes'], 'matched request')} "
            "differ in prompt or output length: A and B are not runs of the same workload",
            file=sys.stderr,
        )
    if out is not None:
        try:
            written = comparison.write(out)
        except OSError as error:
            reason = error.strerror or str(error)
            raise ScenarioError(
                "--out", "", f"cannot write {error.filename or out} ({reason})"
            ) from None
        print(f"written to {out}/: {', '.join(path.name for path in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
