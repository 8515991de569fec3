"""``simsim compare``: how far one run's latencies are from another's."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from simsim.cli.shared import (
    install,
    output_folder,
)
from simsim.cli.usage import UsageError
from simsim.wording import counted


def execute(args: argparse.Namespace) -> int:
    """Print how far run B's latencies are from run A's (and write them with ``--out``);
    returns the exit status."""
    from simsim.fidelity.compare import compare_runs

    if args.out is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            "simsim: error: compare --out draws figures, which needs matplotlib: "
            f"{install('plot')}",
            file=sys.stderr,
        )
        return 2
    labels = None
    if args.labels is not None:
        names = args.labels.split(",")
        if len(names) != 2 or not all(name.strip() for name in names):
            raise UsageError(
                "--labels", f"must be two names separated by a comma, got {args.labels!r}"
            )
        labels = (names[0].strip(), names[1].strip())
    try:
        percentiles = [float(value) for value in args.percentiles.split(",")]
    except ValueError:
        raise UsageError(
            "--percentiles",
            f"must be numbers separated by commas (50,90,99), got {args.percentiles!r}",
        ) from None
    out = output_folder(args.out) if args.out is not None else None
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
            raise UsageError("--out", f"cannot write {error.filename or out} ({reason})") from None
        print(f"written to {out}/: {', '.join(path.name for path in written)}")
    return 0
