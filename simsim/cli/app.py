"""The entry point: parse the command line, hand it to its command, turn errors into exits."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from simsim.cli import calibrate, compare, plan, plot, replay, run, serve, sweep, validate
from simsim.cli.parser import build_parser, check_usage
from simsim.cli.usage import UsageError
from simsim.scenario import ScenarioError, ScenarioMemoryError, lost_allocation

__all__ = ["COMMANDS", "main"]

COMMANDS: Mapping[str, Callable[[argparse.Namespace], int]] = {
    "run": run.execute,
    "validate": validate.execute,
    "sweep": sweep.execute,
    "serve": serve.execute,
    "replay": replay.execute,
    "calibrate": calibrate.execute,
    "plot": plot.execute,
    "compare": compare.execute,
    "plan": plan.execute,
}
"""Each command's name on the command line -> the function that carries it out, which
returns the exit status (docs/user-guide.md lists them)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simsim`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    check_usage(args)
    try:
        return COMMANDS[args.command](args)
    except (ScenarioError, UsageError) as error:
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
