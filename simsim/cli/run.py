"""``simsim run``: run a scenario, print its summary and write its results folder."""

from __future__ import annotations

import argparse
import sys
import time

from simsim.cli.report import (
    batching_lines,
    class_lines,
    cluster_lines,
    frontend_lines,
    overload_line,
    summary_table,
    vllm_lines,
)
from simsim.cli.shared import (
    ProgressBar,
    building_tables,
    run_output_folder,
    scenario_from_args,
    write_tables,
)
from simsim.cluster import Cluster
from simsim.errors import SimulationError
from simsim.results import server_kv_blocks, server_replicas
from simsim.run_folder import holds_a_run
from simsim.scenario import (
    ScenarioError,
    out_of_memory_while,
    run_scenario,
)
from simsim.wording import counted


def execute(args: argparse.Namespace) -> int:
    """Run the scenario, write its results folder and print its summary;
    returns the exit status."""
    scenario = scenario_from_args(args)
    out = run_output_folder(args)
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
    with out_of_memory_while(scenario.source, lambda: building_tables(engine)):
        frames = write_tables("--out", out, engine, args.format, scenario)
    summary = frames["summary"].set_index("metric")
    if replacing:
        print(f"simsim: replaced the tables of an earlier run in {out}/", file=sys.stderr)
    print(f"scenario {scenario.name!r} ({scenario.source}), seed {scenario.seed}")
    replicas = server_replicas(engine)
    server = [] if scenario.vllm is None else vllm_lines(scenario.vllm)
    server += (
        batching_lines(
            server_kv_blocks(engine),
            engine.prefix_cache,
            frames["iterations"],
            frames["events"],
            frames["requests"],
        )
        if "iterations" in frames
        else []
    )
    if isinstance(engine, Cluster):
        server.extend(cluster_lines(engine, scenario, frames["requests"], summary["value"]))
    if scenario.scheduler != "fcfs":
        options = ", ".join(f"{key} {value:g}" for key, value in scenario.scheduler_options)
        server.append(f"scheduler     {scenario.scheduler}{f' ({options})' if options else ''}")
    print(summary_table(summary, frames["requests"], server))
    if scenario.frontend is not None:
        print("\n".join(frontend_lines(scenario.frontend)))
    overload = overload_line(frames["requests"])
    if overload is not None:
        print(overload)
    classes = class_lines(frames["requests"], scenario.slo_targets())
    if classes:
        print("\n".join(classes))
    events = sum(replica.processed_event_count for replica in replicas)
    print(
        f"{counted(events, 'event')} simulated in {wall_s:.2f} s of wall time; "
        f"results in {out}/ ({args.format})"
    )
    print("All times are simulated from the cost model, not measured on hardware.")
    return 0
