"""``simsim plan``: how many GPUs, of which type, at which tensor parallelism."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simsim.cli.parser import DEFAULT_DURATION_S, TARGET_FLAGS
from simsim.cli.report import plan_report
from simsim.cli.shared import ProgressBar, install
from simsim.cli.sweep import executor_for
from simsim.cli.usage import UsageError
from simsim.sweeps.plan import CapacityPlan, plan_capacity
from simsim.sweeps.plan_file import plan_from_file
from simsim.sweeps.signals import SweepStopped
from simsim.workloads import Fixed, FixedRateArrivals, OpenLoopWorkload, PoissonArrivals

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(us|ms|s|min)?\s*$")
_MS_PER_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "min": 60_000.0}
_WORKLOAD_FLAGS = ("model", "rate", "prompt", "output", "duration", "arrivals")
"""The flags that describe the server and the requests without a scenario file."""


def execute(args: argparse.Namespace) -> int:
    """Plan and print the table and the answer; returns the exit status."""
    options = _search_options(args)
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers", f"must be >= 1, got {args.workers}")
    if args.seed is not None and args.seed < 0:
        raise UsageError("--seed", f"must be >= 0, got {args.seed}")
    make = _from_file(args, options) if args.scenario else _from_flags(args, options)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            f"simsim: error: --plot needs matplotlib, which is not installed: {install('plot')}",
            file=sys.stderr,
        )
        return 2
    with contextlib.ExitStack() as stack:
        executor = executor_for(args, stack)
        if executor is False:
            return 2
        try:
            plan = make(
                executor=executor,
                workers=args.workers,
                progress=ProgressBar(sys.stderr, "plan"),
            )
        except KeyboardInterrupt as error:
            status = error.exit_status if isinstance(error, SweepStopped) else 130
            print(f"\nsimsim: {error or 'interrupted'}", file=sys.stderr)
            return status
        except (ValueError, TypeError) as error:
            print(f"simsim: error: {error}", file=sys.stderr)
            return 2
    print(plan_report(plan))
    try:
        _write(plan, args)
    except _WriteError as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 1
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0


def _search_options(args: argparse.Namespace) -> dict[str, Any]:
    """``plan_capacity``'s keyword arguments from the flags given (and only those)."""
    options: dict[str, Any] = {}
    if args.gpus is not None:
        options["gpus"] = _list(args.gpus, "--gpus")
    if args.tp is not None:
        options["tp"] = [_int(value, "--tp") for value in _list(args.tp, "--tp")]
    if args.max_replicas is not None:
        options["max_replicas"] = args.max_replicas
    if args.router is not None:
        options["router"] = args.router
    if args.price:
        prices = dict(_pair(text, "--price") for text in args.price)
        options["prices"] = {gpu: _float(value, "--price") for gpu, value in prices.items()}
    targets = _targets(args)
    if targets:
        options["targets"] = targets
    return options


def _from_flags(args: argparse.Namespace, options: dict[str, Any]) -> Callable[..., CapacityPlan]:
    """The plan of the server and requests the flags describe."""
    for name in ("model", "rate", "prompt", "output"):
        if getattr(args, name) is None:
            raise UsageError(f"--{name}", "is required without a scenario file (SCENARIO.toml)")
    if "targets" not in options:
        raise UsageError(
            "--ttft-p99/--itl-p99/--e2e-p99/--target",
            "give at least one target, e.g. --ttft-p99 2s",
        )
    workload = _workload(args)
    seed = 0 if args.seed is None else args.seed
    return functools.partial(plan_capacity, args.model, workload, seed=seed, **options)


def _from_file(args: argparse.Namespace, options: dict[str, Any]) -> Callable[..., CapacityPlan]:
    """The plan of a scenario file's server and requests; the flags given win."""
    for name in _WORKLOAD_FLAGS:
        if getattr(args, name) is not None:
            raise UsageError(
                f"--{name}",
                "comes from the scenario file ([vllm] and its requests): leave it out, or "
                "leave out the file",
            )
    return functools.partial(plan_from_file, args.scenario, seed=args.seed, **options)


class _WriteError(Exception):
    """An output file the flags name could not be written (the message says which)."""


def _write(plan: CapacityPlan, args: argparse.Namespace) -> None:
    """The table as CSV and the figure, where the flags ask for them."""
    if args.table:
        try:
            plan.table.to_csv(args.table, index=False)
        except OSError as error:
            raise _WriteError(f"--table {args.table}: cannot write it ({error})") from None
        print(f"table: {args.table}")
    if args.plot:
        import matplotlib.pyplot as plt

        from simsim import plots

        figure = plots.draw_plan(plan.table)
        try:
            figure.savefig(Path(args.plot), dpi=120)
        except OSError as error:
            raise _WriteError(f"--plot {args.plot}: cannot write it ({error})") from None
        finally:
            plt.close(figure)
        print(f"plot: {args.plot}")


def _targets(args: argparse.Namespace) -> dict[str, float]:
    """The targets the flags give, in ms, by metric."""
    targets: dict[str, float] = {}
    for flag, metric in TARGET_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            targets[metric] = duration_ms(value, f"--{flag.replace('_', '-')}")
    for text in args.target:
        name, value = _pair(text, "--target")
        metric = name if name.endswith("_ms") else f"{name}_ms"
        targets[metric] = duration_ms(value, "--target")
    return targets


def duration_ms(text: str, flag: str) -> float:
    """*text* (``2s``, ``100ms``, ``1.5min``, ``250us``; a bare number is ms) in ms."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(flag, f"expected a time such as 2s or 100ms, got {text!r}")
    value = float(match.group(1)) * _MS_PER_UNIT[match.group(2) or "ms"]
    if not math.isfinite(value) or value <= 0:
        raise UsageError(flag, f"must be a time above zero, got {text!r}")
    return value


def _workload(args: argparse.Namespace) -> OpenLoopWorkload:
    """The requests the flags describe: fixed sizes, Poisson (or evenly spaced) arrivals."""
    if not args.rate > 0 or not math.isfinite(args.rate):
        raise UsageError("--rate", f"must be a number of requests per second > 0, got {args.rate}")
    duration = DEFAULT_DURATION_S if args.duration is None else args.duration
    if not duration > 0 or not math.isfinite(duration):
        raise UsageError("--duration", f"must be a number of seconds > 0, got {duration}")
    for flag, value in (("--prompt", args.prompt), ("--output", args.output)):
        if value < 0:
            raise UsageError(flag, f"must be a number of tokens >= 0, got {value}")
    count = max(1, round(args.rate * duration))
    arrivals = (
        FixedRateArrivals(args.rate) if args.arrivals == "fixed" else PoissonArrivals(args.rate)
    )
    return OpenLoopWorkload(arrivals, Fixed(args.prompt), Fixed(args.output), count=count)


def _list(text: str, flag: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not any(items) or not all(items):
        raise UsageError(flag, f"give a comma-separated list with no empty entry, got {text!r}")
    return items


def _int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(flag, f"expected whole numbers, got {text!r}") from None


def _float(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(flag, f"expected a number, got {text!r}") from None


def _pair(text: str, flag: str) -> tuple[str, str]:
    name, sign, value = text.partition("=")
    if not sign or not name.strip() or not value.strip():
        raise UsageError(flag, f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()
