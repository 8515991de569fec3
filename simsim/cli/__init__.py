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

The package: ``parser`` builds the argument parser, ``app`` dispatches a parsed command
line through its table of commands (``COMMANDS``) and turns errors into exit statuses,
one module per command (``run``, ``validate``, ``sweep``, ``serve``, ``replay``,
``calibrate``, ``plot``, ``compare``) carries it out, ``report`` formats what the library
computed (:mod:`simsim.results`) for a terminal, and ``shared`` holds what several
commands do alike (results folders, the progress bar). A flag that breaks a rule raises
:class:`UsageError`.
"""

from __future__ import annotations

from simsim.cli.app import main
from simsim.cli.shared import ProgressBar
from simsim.cli.usage import UsageError

__all__ = ["ProgressBar", "UsageError", "main"]
