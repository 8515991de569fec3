"""The ``simsim`` command-line tool: run, validate and plot scenarios.

``simsim run [SCENARIO.toml] [--out DIR] [--format csv|parquet] [--seed N]`` runs a
scenario (the built-in default when none is given), prints a summary table and writes
``requests``, ``events``, ``admissions`` and ``summary`` files. ``simsim validate``
checks a scenario file without running it. ``simsim sweep SWEEP.toml --out DIR
[--workers N | --dask ADDRESS]`` runs a sweep or capacity search file, writing each
finished run at once so that running it again resumes. ``simsim plot DIR`` draws
figures from a run's or a sweep's results folder. Exit status: 0 on success, 1 when a
simulation fails, 2 for a bad scenario, sweep file or arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from simsim.engines import BatchingEngine
from simsim.errors import SimulationError
from simsim.results import summarize
from simsim.scenario import Scenario, ScenarioError, default_scenario, load_scenario, run_scenario
from simsim.sweeps.runner import MANIFEST, SweepFolderError
from simsim.sweeps.signals import SweepStopped
from simsim.sweeps.spec import load_sweep, run_sweep
from simsim.sweeps.sweep import SweepResult

__all__ = ["main"]

RESULT_TABLES = ("requests", "events", "admissions", "summary")


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
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a scenario and write its results")
    run.add_argument("scenario", nargs="?", help="a scenario TOML file (default: built-in demo)")
    run.add_argument(
        "--out", default="simsim-results", help="results folder (default: %(default)s)"
    )
    run.add_argument("--format", choices=("csv", "parquet"), default="csv", help="file format")
    run.add_argument("--seed", type=int, default=None, help="seed for generated workloads")

    validate = commands.add_parser("validate", help="check a scenario file without running it")
    validate.add_argument("scenario", help="a scenario TOML file")

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

    plot = commands.add_parser("plot", help="draw PNG figures from a results folder")
    plot.add_argument("results", help="a folder written by 'simsim run' or 'simsim sweep'")
    plot.add_argument("--out", default=None, help="where to write the PNGs (default: RESULTS)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simsim`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "sweep":
            return _sweep(args)
        return _plot(args)
    except ScenarioError as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; that is not an error of ours.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


def _load(args: argparse.Namespace) -> Scenario:
    if args.seed is not None and args.seed < 0:
        raise ScenarioError("--seed", "", f"must be >= 0, got {args.seed}")
    if args.scenario is None:
        return default_scenario(0 if args.seed is None else args.seed)
    return load_scenario(args.scenario, seed=args.seed)


def _run(args: argparse.Namespace) -> int:
    scenario = _load(args)
    if args.format == "parquet" and importlib.util.find_spec("pyarrow") is None:
        print(
            "simsim: error: --format parquet needs pyarrow: pip install 'simsim[parquet]'",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    try:
        engine = run_scenario(scenario, progress=ProgressBar(sys.stderr, "simulating"))
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
    frames = {
        "requests": engine.requests_frame(),
        "events": engine.events_frame(),
        "admissions": engine.admissions_frame(),
    }
    if isinstance(engine, BatchingEngine):
        frames["iterations"] = engine.iterations_frame()
    summary = summarize(frames["requests"])
    frames["summary"] = summary.reset_index()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        path = out / f"{name}.{args.format}"
        if args.format == "csv":
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
    print(f"scenario {scenario.name!r} ({scenario.source}), seed {scenario.seed}")
    print(_summary_table(summary))
    print(
        f"{engine.processed_event_count} events simulated in {wall_s:.2f} s of wall time; "
        f"results in {out}/ ({args.format})"
    )
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0


def _summary_table(summary: pd.DataFrame) -> str:
    values = summary["value"]
    lines = []
    counts = ", ".join(
        f"{name.removeprefix('count_').lower()} {values[name]:.0f}"
        for name in values.index
        if name.startswith("count_") and values[name] > 0
    )
    lines.append(f"requests      {values['requests']:.0f} ({counts})")
    lines.append(f"makespan      {_ms(values['makespan_us'])}")
    lines.append(
        f"throughput    {values['throughput_requests_per_s']:.2f} requests/s, "
        f"{values['throughput_tokens_per_s']:.1f} tokens/s"
    )
    lines.append(f"{'':14}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}")
    for column, label in (
        ("queue_delay_us", "queue delay"),
        ("ttft_us", "TTFT"),
        ("e2e_latency_us", "e2e latency"),
        ("tpot_us", "TPOT"),
    ):
        cells = "".join(
            f"{_ms(values[f'{column}_{stat}']):>12}" for stat in ("mean", "p50", "p90", "p99")
        )
        lines.append(f"{label:<14}{cells}")
    return "\n".join(lines)


def _ms(value_us: float) -> str:
    if pd.isna(value_us):
        return "-"
    return f"{value_us / 1000:.1f} ms"


def _validate(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    requests = scenario.all_requests()
    print(
        f"{args.scenario}: ok: scenario {scenario.name!r}, engine {scenario.engine}, "
        f"{len(requests)} requests, {len(scenario.cancellations)} cancellations"
    )
    return 0


def _sweep(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", "", f"must be at least 1, got {args.workers}")
    spec = load_sweep(args.sweep_file)
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        executor = None
        if args.dask is not None:
            executor = _dask_executor(args.dask, stack)
            if executor is None:
                return 2
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
        print(f"resumed: {result.reused} finished runs in {out}/ were kept, not run again")
    print(_sweep_report(result, capacity))
    tables = "runs.csv, summary.csv" + (", capacity.csv" if capacity is not None else "")
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
            "simsim: error: --dask needs Dask's distributed package: pip install 'simsim[dask]'",
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
    wanted = ("ttft_us_p99", "e2e_latency_us_p99", "throughput_tokens_per_s")
    table = result.summary[result.summary["metric"].isin(wanted)]
    wide = table.pivot_table(index=["point", *keys], columns="metric", values="mean", sort=False)
    wide = wide.reindex(columns=[m for m in wanted if m in wide.columns])
    return (
        f"{result.runs['point'].nunique()} points x {result.replications} replications "
        f"(means over replications):\n{wide.to_string()}"
    )


def _number(value: Any) -> str:
    """A number for a report, ``-`` for a missing one."""
    return "-" if value is None or pd.isna(value) else f"{value:g}"


def _plot(args: argparse.Namespace) -> int:
    try:
        from simsim import plots
    except ImportError as error:
        if not (error.name or "").split(".")[0] == "matplotlib":
            raise
        print(
            "simsim: error: plotting needs matplotlib, which is not installed: "
            "pip install 'simsim[plot]'",
            file=sys.stderr,
        )
        return 2
    try:
        results, target = Path(args.results), Path(args.out) if args.out else None
        if (results / MANIFEST).exists():
            written = plots.plot_sweep(results, target)
        else:
            written = plots.plot_results(results, target)
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
