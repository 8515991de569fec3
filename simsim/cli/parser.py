"""The argument parser of every command and the flag rules argparse cannot state."""

from __future__ import annotations

import argparse
from typing import Any

from simsim import __version__
from simsim.run_folder import FORMATS

DEFAULT_DURATION_S = 60.0
"""Seconds of arrivals ``simsim plan`` simulates without ``--duration``."""

# The shorthand flags: flag -> the target metric it sets.
TARGET_FLAGS = {
    "ttft_p99": "ttft_p99_ms",
    "itl_p99": "itl_p99_ms",
    "e2e_p99": "e2e_p99_ms",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``simsim`` argument parser: one subcommand per entry of the command table."""
    parser = argparse.ArgumentParser(
        prog="simsim",
        description="Simulate an LLM serving engine (simulated costs, not measured hardware).",
    )
    parser.add_argument("--version", action="version", version=f"simsim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a scenario and write its results")
    run.add_argument("scenario", nargs="?", help="a scenario TOML file (default: built-in demo)")
    run.add_argument(
        "--out", default="simsim-results", help="results folder (default: %(default)s)"
    )
    run.add_argument("--format", choices=FORMATS, default="csv", help="file format")
    run.add_argument("--seed", type=int, default=None, help="seed for generated workloads")
    add_backend_argument(run)

    validate = commands.add_parser("validate", help="check a scenario file without running it")
    validate.add_argument("scenario", help="a scenario TOML file")
    validate.add_argument(
        "--serve",
        action="store_true",
        help="check it as 'simsim serve' reads it (a serving scenario needs no requests)",
    )
    add_backend_argument(validate)

    sweep = commands.add_parser(
        "sweep", help="run a sweep or capacity search file, resumable, on many processes"
    )
    sweep.add_argument("sweep_file", metavar="SWEEP.toml", help="a sweep file (docs/sweeps.md)")
    sweep.add_argument("--out", required=True, help="results folder; rerun to resume")
    add_executor_arguments(sweep)

    serve = commands.add_parser(
        "serve",
        help="serve a scenario's server as an OpenAI-compatible HTTP API, in real time",
        description="Serve the scenario's server (or a built-in batching server) over HTTP: "
        "OpenAI's /v1/completions and /v1/chat/completions, /v1/models, /health and "
        "/metrics, with timing from the simulation (docs/serve.md). Ctrl-C stops it.",
    )
    serve.add_argument(
        "scenario", nargs="?", help="a scenario TOML file (default: a built-in batching server)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    serve.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated seconds per wall second (default: %(default)s; 10 runs 10x faster)",
    )
    add_backend_argument(serve)
    serve.add_argument("--model", default="simsim", help="the model name served")
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context limit in tokens (default: the KV cache's capacity, else 8192)",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="answer 429 while this many requests wait (default: no limit)",
    )
    serve.add_argument(
        "--retry-after",
        type=int,
        default=1,
        help="Retry-After of a 429 or 503, wall seconds (default: 1)",
    )
    serve.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        help="fraction of valid completion requests answered with --fail-status (default: 0)",
    )
    serve.add_argument(
        "--fail-status", type=int, default=500, help="HTTP status of an injected failure"
    )
    serve.add_argument("--fail-seed", type=int, default=0, help="seed of the failure draws")
    serve.add_argument(
        "--record", metavar="DIR", default=None, help="write the run's tables to DIR on shutdown"
    )
    serve.add_argument(
        "--format", choices=FORMATS, default=None, help="--record's file format (default: csv)"
    )

    add_replay_parser(commands)
    add_calibrate_parser(commands)
    add_plan_parser(commands)

    plot = commands.add_parser("plot", help="draw PNG figures from a results folder")
    plot.add_argument(
        "results", help="a folder written by 'simsim run', 'simsim sweep' or 'simsim replay'"
    )
    plot.add_argument("--out", default=None, help="where to write the PNGs (default: RESULTS)")

    compare = commands.add_parser(
        "compare",
        help="compare two results folders' latencies (measured against simulated, say)",
        description="Per-request errors |B - A| / A of TTFT, TPOT and E2E, and each "
        "distribution's percentiles, with A the reference (docs/fidelity.md). Two "
        "measurements of one workload give the server's run-to-run noise.",
    )
    compare.add_argument("a", metavar="A_DIR", help="the reference run's results folder")
    compare.add_argument("b", metavar="B_DIR", help="the results folder compared with it")
    compare.add_argument(
        "--out",
        default=None,
        help="write the tables, a JSON summary and figures here (figures need simsim[plot])",
    )
    compare.add_argument(
        "--labels", default=None, metavar="A,B", help="names of the two runs (default: folders')"
    )
    compare.add_argument(
        "--percentiles",
        default="50,90,99",
        metavar="P,P,...",
        help="distribution percentiles to compare (default: %(default)s)",
    )
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)  # for usage errors found after parsing
    return parser


def check_usage(args: argparse.Namespace) -> None:
    """Refuse option combinations argparse cannot express, as argparse refuses (exit 2)."""
    if args.command == "serve" and args.format is not None and args.record is None:
        args.command_parser.error(
            f"--format {args.format} sets the format of --record's files, and --record is "
            "not given: add --record DIR, or leave --format out"
        )


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers N`` or ``--dask ADDRESS``: where a command's many runs go."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--workers", type=int, default=None, help="local worker processes (default: one per CPU)"
    )
    where.add_argument(
        "--dask",
        metavar="ADDRESS",
        default=None,
        help="run on a Dask cluster at ADDRESS (needs simsim[dask]); 'local' starts one here",
    )


def add_plan_parser(commands: Any) -> None:
    """``simsim plan``'s arguments."""
    plan = commands.add_parser(
        "plan",
        help="find the cheapest GPU type x tensor parallelism x replicas within SLO targets",
        description="Simulate a workload on replicas of a vLLM-shaped server for every GPU "
        "type and tensor-parallel degree given, find the fewest replicas that meet the "
        "targets by bisection, and print what was tried, why each failed and the cheapest "
        "configuration that passed (docs/gpu.md, 'How many GPUs: simsim plan').",
    )
    plan.add_argument(
        "scenario",
        nargs="?",
        metavar="SCENARIO.toml",
        help='a scenario file with engine = "vllm" (its model, settings and requests) and '
        "an optional [plan] table, instead of --model and the workload flags",
    )
    plan.add_argument("--model", default=None, help="a preset's Hugging Face id or config.json")
    plan.add_argument("--rate", type=float, default=None, help="requests per second")
    plan.add_argument("--prompt", type=int, default=None, help="prompt tokens per request")
    plan.add_argument("--output", type=int, default=None, help="output tokens per request")
    plan.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds of arrivals to simulate (default: {DEFAULT_DURATION_S:g})",
    )
    plan.add_argument(
        "--arrivals",
        choices=("poisson", "fixed"),
        default=None,
        help="Poisson arrivals or one every 1/rate s (default: poisson)",
    )
    plan.add_argument(
        "--gpus",
        metavar="GPU,GPU,...",
        default=None,
        help="GPU types (default: H100,A100-80GB,L40S)",
    )
    plan.add_argument(
        "--tp", metavar="N,N,...", default=None, help="tensor-parallel degrees (default: 1,2,4,8)"
    )
    plan.add_argument(
        "--max-replicas",
        metavar="N",
        type=int,
        default=None,
        help="most replicas per configuration (default: 16)",
    )
    for flag, metric in TARGET_FLAGS.items():
        plan.add_argument(
            f"--{flag.replace('_', '-')}",
            metavar="TIME",
            default=None,
            help=f"target for {metric.removesuffix('_ms')}, e.g. 2s or 100ms",
        )
    plan.add_argument(
        "--target",
        metavar="METRIC=TIME",
        action="append",
        default=[],
        help="another target, e.g. e2e_p90=30s or ttft_mean=500ms (may be repeated)",
    )
    plan.add_argument(
        "--price",
        metavar="GPU=USD",
        action="append",
        default=[],
        help="a GPU's price per GPU-hour instead of the preset's (may be repeated)",
    )
    plan.add_argument(
        "--router",
        default=None,
        help="the router in front of the replicas (default: least_outstanding)",
    )
    plan.add_argument(
        "--seed", type=int, default=None, help="workload seed (default: 0, or the file's)"
    )
    plan.add_argument("--table", metavar="CSV", default=None, help="also write the table here")
    plan.add_argument(
        "--plot", metavar="PNG", default=None, help="draw what was tried (needs simsim[plot])"
    )
    add_executor_arguments(plan)


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend FILE``, as run, validate and serve take it."""
    parser.add_argument(
        "--backend",
        metavar="FILE",
        default=None,
        help="take the [backend] table from FILE (e.g. one simsim calibrate wrote)",
    )


def add_replay_parser(commands: Any) -> None:
    """``simsim replay``'s arguments."""
    replay = commands.add_parser(
        "replay",
        help="play a scenario's requests against a real OpenAI-compatible server and measure",
        description="Send the scenario's requests to URL/v1/completions at their arrival "
        "times (real time, open loop, streamed, cancelled on schedule) and write what was "
        "measured as a results folder (docs/fidelity.md).",
    )
    replay.add_argument("scenario", help="a scenario TOML file (open-loop requests)")
    replay.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    replay.add_argument("--out", required=True, help="the measured results folder")
    replay.add_argument("--format", choices=FORMATS, default="csv", help="file format")
    replay.add_argument("--seed", type=int, default=None, help="seed for generated workloads")
    add_client_arguments(replay)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The request options ``simsim replay`` and ``simsim calibrate`` share."""
    parser.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    parser.add_argument(
        "--token-ids",
        metavar="LOW-HIGH",
        default="3-1002",
        help="prompt token ids drawn from LOW to HIGH, both included (default: %(default)s)",
    )
    parser.add_argument(
        "--prompt-seed", type=int, default=None, help="seed of the prompt ids (default: fresh)"
    )
    parser.add_argument(
        "--ban-tokens", metavar="IDS", default="", help="comma-separated ids given logit_bias -100"
    )
    parser.add_argument(
        "--extra-body",
        metavar="JSON",
        default="{}",
        help="more request fields, e.g. '{\"cache_prompt\": false}' for llama.cpp",
    )
    parser.add_argument(
        "--no-exact-output",
        action="store_true",
        help="do not send ignore_eos and min_tokens (for a server that refuses them)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait to connect or for the next chunk (default: %(default)s)",
    )


def add_calibrate_parser(commands: Any) -> None:
    """``simsim calibrate``'s arguments."""
    calibrate = commands.add_parser(
        "calibrate",
        help="probe a real OpenAI-compatible server and fit a [backend] table to it",
        description="Send probes (prompt lengths x output lengths x concurrency levels, "
        "repeated) to URL/v1/completions one at a time, fit the fitted cost model by "
        "non-negative least squares, print the fit quality and write a [backend] table "
        "a scenario can use (docs/fidelity.md).",
    )
    calibrate.add_argument("--url", default=None, help="the server, e.g. http://127.0.0.1:8080")
    calibrate.add_argument("--out", required=True, help="the backend TOML file to write")
    calibrate.add_argument(
        "--engine",
        choices=("single_slot", "batching"),
        default="single_slot",
        help="the simsim server the model is for (default: %(default)s)",
    )
    calibrate.add_argument(
        "--prompts",
        metavar="N,N,...",
        default=None,
        help="prompt lengths to probe (default: 16,64,256,512,1024, or the workload's)",
    )
    calibrate.add_argument(
        "--outputs",
        metavar="N,N,...",
        default=None,
        help="output lengths to probe, more than 8 (default: 64, or the workload's)",
    )
    calibrate.add_argument(
        "--concurrency",
        metavar="N,N,...",
        default=None,
        help="requests sent together per probe (default: 1; batching: 1,2,4)",
    )
    calibrate.add_argument(
        "--repeats", type=int, default=3, help="times each probe runs (default: %(default)s)"
    )
    calibrate.add_argument(
        "--workload",
        metavar="SCENARIO",
        default=None,
        help="probe the prompt and output lengths (and slots) of this scenario's requests",
    )
    calibrate.add_argument(
        "--probes-out", metavar="CSV", default=None, help="also save the probes table here"
    )
    calibrate.add_argument(
        "--measured",
        metavar="DIR",
        action="append",
        default=None,
        help="fit decode steps to this replayed workload's token gaps instead of the "
        "probes' (a folder simsim replay wrote; may be repeated)",
    )
    calibrate.add_argument(
        "--from-probes",
        metavar="CSV",
        default=None,
        help="fit a saved probes table instead of probing a server (no --url)",
    )
    add_client_arguments(calibrate)
