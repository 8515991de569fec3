"""``simsim plot``: draw PNG figures from a run's or a sweep's results folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simsim.cli.shared import (
    install,
    output_folder,
)
from simsim.sweeps.sweep import is_sweep_folder


def execute(args: argparse.Namespace) -> int:
    """Draw the figures of a run's or a sweep's results folder and print their paths;
    returns the exit status."""
    try:
        from simsim import plots
    except ImportError as error:
        if not (error.name or "").split(".")[0] == "matplotlib":
            raise
        print(
            f"simsim: error: plotting needs matplotlib, which is not installed: {install('plot')}",
            file=sys.stderr,
        )
        return 2
    try:
        results, target = Path(args.results), output_folder(args.out) if args.out else None
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
