"""What several commands do alike: the progress bar, the scenario the flags name,
results folders and the tables written to them."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from simsim.backend import FittedBackendConfig
from simsim.cli.usage import UsageError
from simsim.clock import MAX_TIME_US
from simsim.cluster import Cluster
from simsim.results import run_tables
from simsim.run_folder import write_run_folder
from simsim.scenario import (
    Scenario,
    ScenarioError,
    Server,
    default_scenario,
    load_backend,
    load_scenario,
)
from simsim.scenario.engine_kinds import cannot
from simsim.sweeps.sweep import is_sweep_folder
from simsim.wording import counted


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


def check_seed(seed: int | None) -> None:
    """``--seed``, if given, as ``[scenario] seed`` takes it: 0 to 2**63 - 1."""
    if seed is not None and seed < 0:
        raise UsageError("--seed", f"must be >= 0, got {seed}")
    if seed is not None and seed > MAX_TIME_US:
        raise UsageError("--seed", f"must be at most 2**63 - 1, got {seed}")


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The scenario ``simsim run`` runs: ``args.scenario``'s file, or the built-in demo,
    with ``--seed`` and ``--backend`` applied."""
    check_seed(args.seed)
    backend = getattr(args, "backend", None)
    if args.scenario is None:
        scenario = default_scenario(0 if args.seed is None else args.seed)
        return scenario if backend is None else with_backend(scenario, backend)
    return load_scenario(args.scenario, seed=args.seed, backend=backend)


def with_backend(scenario: Scenario, path: str) -> Scenario:
    """*scenario* with the cost model of the ``[backend]`` table in the file at *path*."""
    config = load_backend(path)
    refusal = cannot(scenario.engine, "prices_context")
    if isinstance(config, FittedBackendConfig) and refusal is not None:
        raise ScenarioError(path, "backend.kind", refusal)
    return dataclasses.replace(scenario, backend=config)


def output_folder(value: str) -> Path:
    """*value* as a results folder, created if missing; a file or unwritable place is refused.

    Checked before anything runs, so a long simulation never ends in a failed write.
    """
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise UsageError("--out", f"{value} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or str(error)
        raise UsageError("--out", f"cannot create the folder {value} ({reason})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError("--out", f"the folder {value} is not writable")
    return out


def run_output_folder(args: argparse.Namespace) -> Path | None:
    """``--out`` made ready for a run's tables in ``--format``; ``None`` (said why) if not."""
    if args.format == "parquet" and importlib.util.find_spec("pyarrow") is None:
        print(
            f"simsim: error: --format parquet needs pyarrow: {install('parquet')}",
            file=sys.stderr,
        )
        return None
    out = output_folder(args.out)
    if is_sweep_folder(out):
        raise UsageError("--out", f"{out} holds a sweep (it has sweep.json); give another folder")
    return out


def building_tables(engine: Server) -> str:
    """What :func:`write_tables` makes of *engine*'s run, for an out-of-memory message:
    the tables of its requests, on its replicas when it is a cluster."""
    what = (
        "building and writing the result tables of "
        f"{counted(len(engine.requests), 'request', grouped=True)}"
    )
    if isinstance(engine, Cluster):
        what += f" on {counted(len(engine.replicas), 'replica', grouped=True)}"
    return what


def write_tables(
    option: str, out: Path, engine: Server, fmt: Any, scenario: Scenario
) -> dict[str, pd.DataFrame]:
    """Write *engine*'s tables to *out*, stamped with the simulated time it ended at."""
    frames = run_tables(engine, requests=scenario.requests_frame(engine))
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
        raise UsageError(option, f"cannot write {where} ({reason})") from None
    return frames


def install(extra: str) -> str:
    """How to install an optional extra, from the package index or a source checkout."""
    return f"pip install 'simsim[{extra}]' (from a source checkout: pip install '.[{extra}]')"
