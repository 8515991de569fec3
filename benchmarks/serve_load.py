"""``simsim serve`` under load: many concurrent streams, nothing lost, CPU per token.

The server runs as a separate process (``python -m simsim serve --port 0 --speed S
--record DIR``) at a high speed. One client process sends ``--requests`` streaming
completions (default 2,000) from ``--clients`` concurrent clients (default 200; each
sends its next request when its previous one has ended) over loopback, each its own
``httpx.AsyncClient`` with one connection. Prompts are 16 to 512 token ids
and outputs 8 to 64 tokens, drawn from a seed.

It reports:

- **wall time** from the first request sent to the last ``[DONE]``, and the
  **throughput**: requests and generated tokens per wall second;
- **lost requests**: a response with an error, a status other than 200, no ``[DONE]``,
  a number of content chunks other than its ``max_tokens``, a wrong usage chunk, mixed
  ids, or an id another response also had. Then the recorded requests table is
  checked: exactly one row per request sent, every one ``FINISHED`` with all its
  tokens, and the same sizes as the response that carries its id. All must hold;
- **the server's CPU time per generated token**: user plus system time of the server
  process (``/proc/<pid>/stat``, Linux) from just before the first request to just
  after the last response, over the tokens generated. The baseline, in this process:
  the CPU time per token of the offline engine running the same arrivals (the recorded
  table's arrival times and sizes, submitted up front; best of 3), so the ratio reads
  "serving live costs X times the offline simulation per token". The offline run's
  request table must equal the recorded one.

The script exits with status 1 if anything was lost or the tables differ.

Run it:  python benchmarks/serve_load.py [--requests 2000] [--clients 200] [--speed 100]
         [--scenario FILE.toml]
Every figure is wall or CPU time on this machine over loopback, with the client and the
server sharing its cores; the simulated times come from the cost model.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd


def _sibling(name: str) -> ModuleType:
    """The benchmark script *name* beside this one, imported by its path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


timing = _sibling("serve_timing")

PROMPT_TOKENS = (16, 512)
OUTPUT_TOKENS = (8, 64)
OFFLINE_REPEATS = 3


@dataclass(frozen=True)
class LoadResult:
    """One load run."""

    requests: int
    clients: int
    speed: float
    wall_s: float
    tokens: int
    simulated_s: float
    lost: dict[str, int]
    """Lost requests by reason (empty when none was lost)."""
    server_cpu_s: float
    client_cpu_s: float
    offline_cpu_s: float
    table_difference: str | None
    """The first difference between the recorded and the offline request tables."""

    @property
    def lost_count(self) -> int:
        """How many requests were lost, whatever the reason."""
        return sum(self.lost.values())

    @property
    def ok(self) -> bool:
        """Nothing lost, and the recorded table equals the offline engine's."""
        return self.lost_count == 0 and self.table_difference is None

    @property
    def server_cpu_us_per_token(self) -> float:
        return self.server_cpu_s * 1e6 / self.tokens

    @property
    def offline_cpu_us_per_token(self) -> float:
        return self.offline_cpu_s * 1e6 / self.tokens

    @property
    def ratio(self) -> float:
        """Server CPU per token over the offline engine's."""
        return self.server_cpu_s / self.offline_cpu_s


def lost_requests(streams: Sequence[Any], requests: pd.DataFrame) -> dict[str, int]:
    """Count what went wrong, by reason: the responses, then the recorded table."""
    lost: collections.Counter[str] = collections.Counter()
    seen: dict[int, Any] = {}
    answered = set()  # every id a response carried, failed or not
    for stream in streams:
        rid = stream.request_id
        answered.add(rid)
        problem = stream.problem()
        if problem is not None:
            lost[problem.split(":")[0]] += 1
        elif rid in seen:
            lost["duplicated id"] += 1
        else:
            seen[rid] = stream
    lost["not in the recorded table"] += len(set(seen) - set(requests.index))
    lost["recorded but not answered"] += len(set(requests.index) - answered)
    for rid, stream in seen.items():
        if rid not in requests.index:
            continue
        row = requests.loc[rid]
        if row["state"] != "FINISHED":
            lost[f"recorded as {row['state']}"] += 1
        elif (
            int(row["prompt_token_count"]) != stream.prompt_tokens
            or int(row["max_output_tokens"]) != stream.max_tokens
            or int(row["generated_token_count"]) != stream.max_tokens
        ):
            lost["recorded sizes differ from the response"] += 1
    return {reason: count for reason, count in lost.items() if count}


def report(result: LoadResult) -> str:
    """The result as text: a Markdown table, then the verdicts."""
    r = result
    rows = [
        ("requests / concurrent clients", f"{r.requests} / {r.clients}"),
        ("server speed", f"{r.speed:g}"),
        ("wall time, first request to last [DONE]", f"{r.wall_s:.2f} s"),
        ("simulated time, first arrival to last finish", f"{r.simulated_s:.2f} s"),
        ("throughput", f"{r.requests / r.wall_s:,.1f} requests/s"),
        ("generated tokens (content chunks)", f"{r.tokens:,}"),
        ("token throughput", f"{r.tokens / r.wall_s:,.0f} tokens/s"),
        ("lost requests", f"{r.lost_count}"),
        (
            "server CPU (user + system)",
            f"{r.server_cpu_s:.2f} s ({r.server_cpu_s / r.wall_s:.0%} of wall)",
        ),
        ("server CPU per generated token", f"{r.server_cpu_us_per_token:.1f} us"),
        ("client CPU per generated token", f"{r.client_cpu_s * 1e6 / r.tokens:.1f} us"),
        ("offline engine CPU per token (baseline)", f"{r.offline_cpu_us_per_token:.2f} us"),
        ("live over offline, CPU per token", f"{r.ratio:.0f}x"),
    ]
    lines = [
        "simsim serve under load, in another process; httpx streaming clients over loopback "
        "(CPU and wall time on this machine).",
        "",
        "| quantity | value |",
        "| --- | ---: |",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
    ]
    if r.lost:
        lines.append(f"LOST requests by reason: {r.lost}")
    else:
        lines.append(
            "Nothing lost: every response complete, ids unique, one FINISHED row per request "
            "in the recorded table."
        )
    if r.table_difference is None:
        lines.append(
            "The recorded request table equals the offline engine's for the same arrivals."
        )
    else:
        lines.append(
            f"The recorded request table DIFFERS from the offline engine's: {r.table_difference}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> LoadResult:
    """Run the benchmark, print its report and return the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000, help="streaming requests")
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients")
    parser.add_argument("--speed", type=float, default=100.0, help="the server's --speed")
    parser.add_argument("--scenario", default=None, help="a scenario TOML file to serve")
    parser.add_argument("--seed", type=int, default=6, help="seeds the request sizes")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.clients < 1:
        parser.error("--requests and --clients must be >= 1")

    jobs = timing.make_jobs(args.requests, args.seed, PROMPT_TOKENS, OUTPUT_TOKENS)
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "record"
        with (
            timing.quiet_collector(),
            timing.ServerProcess(record, speed=args.speed, scenario=args.scenario) as server,
        ):
            server_cpu = server.cpu_seconds()
            client_cpu = time.process_time()
            started = time.perf_counter()
            streams = asyncio.run(timing.send_all(server.base_url, jobs, args.clients))
            wall_s = time.perf_counter() - started
            client_cpu = time.process_time() - client_cpu
            server_cpu = server.cpu_seconds() - server_cpu
        requests = timing.read_requests(record)

    offline_cpu = []
    for _ in range(OFFLINE_REPEATS):
        engine, cpu_s = timing.run_offline(requests, args.scenario)
        offline_cpu.append(cpu_s)
    finished = requests["finish_time_us"].dropna()
    result = LoadResult(
        requests=len(jobs),
        clients=args.clients,
        speed=args.speed,
        wall_s=wall_s,
        tokens=sum(len(stream.chunk_s) for stream in streams),
        simulated_s=(float(finished.max()) - float(requests["arrival_time_us"].min())) / 1e6
        if len(finished)
        else 0.0,
        lost=lost_requests(streams, requests),
        server_cpu_s=server_cpu,
        client_cpu_s=client_cpu,
        offline_cpu_s=min(offline_cpu),
        table_difference=timing.first_difference(requests, engine.requests_frame()),
    )
    print(report(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main().ok else 1)
