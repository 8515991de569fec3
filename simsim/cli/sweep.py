"""``simsim sweep``: run a sweep or capacity search file, resumably."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

from simsim.cli.report import (
    sweep_report,
)
from simsim.cli.shared import (
    ProgressBar,
    install,
    output_folder,
)
from simsim.cli.usage import UsageError
from simsim.errors import SimulationError
from simsim.sweeps.runner import SweepFolderError
from simsim.sweeps.signals import SweepStopped
from simsim.sweeps.spec import load_sweep
from simsim.sweeps.sweep import RUNS_FILE, SUMMARY_FILE
from simsim.sweeps.sweep_file import CAPACITY_FILE, run_sweep
from simsim.wording import counted


def execute(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep or capacity search file and print its report;
    returns the exit status."""
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers", f"must be >= 1, got {args.workers}")
    spec = load_sweep(args.sweep_file)
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        executor = executor_for(args, stack)
        if executor is False:
            return 2
        output_folder(args.out)  # a file or an unmakeable folder exits 2 before any run
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
    print(sweep_report(result, capacity))
    tables = f"{RUNS_FILE}, {SUMMARY_FILE}" + (f", {CAPACITY_FILE}" if capacity is not None else "")
    print(f"results in {out}/: {tables}")
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0


def executor_for(
    args: argparse.Namespace, stack: contextlib.ExitStack
) -> Executor | Literal[False] | None:
    """The Dask executor ``--dask`` names, ``None`` for a local process pool (no
    ``--dask``), or ``False`` when Dask cannot be had (the error is printed)."""
    if args.dask is None:
        return None
    executor = dask_executor(args.dask, stack)
    return False if executor is None else executor


def dask_executor(address: str, stack: contextlib.ExitStack) -> Executor | None:
    """A Dask executor for *address* ('local' starts a cluster here), closed by *stack*."""
    try:
        # Imported by name: Dask is an optional extra, and untyped.
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        print(
            f"simsim: error: --dask needs Dask's distributed package: {install('dask')}",
            file=sys.stderr,
        )
        return None
    if address == "local":
        cluster = stack.enter_context(
            distributed.LocalCluster(processes=True, threads_per_worker=1, dashboard_address=None)
        )
        client = stack.enter_context(distributed.Client(cluster))
    else:
        try:
            client = stack.enter_context(distributed.Client(address))
        except OSError as error:  # no scheduler there (Dask's own timeout passed)
            print(
                f"simsim: error: --dask {address}: cannot reach a Dask scheduler there ({error})",
                file=sys.stderr,
            )
            return None
    executor: Executor = client.get_executor()
    return executor
