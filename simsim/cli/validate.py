"""``simsim validate``: check a scenario file without running it."""

from __future__ import annotations

import argparse
import sys

from simsim.cli.serve import serve_notes, serving_scenario
from simsim.scenario import (
    Scenario,
    ScenarioError,
    check_scenario,
    load_scenario,
)
from simsim.wording import counted


def execute(args: argparse.Namespace) -> int:
    """Check the scenario file (as ``run`` or, with ``--serve``, as ``serve`` reads it);
    returns the exit status."""
    if args.serve:
        scenario = serving_scenario(args.scenario, args.backend)
        scenario.build_served()  # what serve builds: an engine or a cluster
        for note in serve_notes(scenario):
            print(note, file=sys.stderr)
        print(
            f"{args.scenario}: ok: scenario {scenario.name!r}, engine {_engine_words(scenario)}, "
            f"{_cluster_words(scenario)}served over HTTP (the clients send the requests)"
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
        f"{args.scenario}: ok: scenario {scenario.name!r}, engine {_engine_words(scenario)}, "
        f"{_cluster_words(scenario)}"
        f"{counted(len(requests), 'request')}, "
        f"{counted(len(scenario.cancellations), 'cancellation')}"
    )
    return 0


def _engine_words(scenario: Scenario) -> str:
    """The engine's name; for ``vllm`` also what it is: ``vllm (meta-llama/Llama-2-7b-hf
    on H100-SXM x 2, 14,901 KV blocks of 16 tokens per replica)``."""
    config = scenario.vllm
    if config is None:
        return scenario.engine
    blocks = config.memory().kv_blocks
    return (
        f"{scenario.engine} ({config.model.name} on {config.gpu.name} x {config.tp}, "
        f"{blocks:,} KV blocks of {config.block_size} tokens per replica)"
    )


def _cluster_words(scenario: Scenario) -> str:
    """``"cluster of 4 x batching (round_robin), "`` for a cluster scenario, else ``""``."""
    return "" if scenario.cluster is None else f"cluster of {scenario.cluster.describe()}, "
