"""A 64-replica batching cluster on 1e5 requests: events per second for several routers,
and the routing cost per request at 1e4 and 1e5 requests.

Every replica is a ``BatchingEngine`` (16 slots, mixed policy, a paged KV cache) on one
environment; requests arrive as one Poisson stream at 10 requests/s per replica, a load
that keeps the replicas busy (about ten requests in a batch of 16) with short queues.

What is counted:

- **events**: the replicas' ``processed_event_count`` summed, that is every heap event
  the simulation processed (an arrival routed by the cluster counts once, as the
  replica's arrival, inside the event that routed it), plus one per **routing
  decision**. ``events/s`` divides that sum by the time ``submit`` and ``run`` took.
- **routing**: the time spent choosing replicas, split into taking the 64
  snapshots (``refresh_interval_us=0``: before every decision) and the router's own
  ``route`` call, per decision. They are timed by wrapping the cluster's snapshot step
  and the router in this process (two clock readings each, included).

The second table runs the first tenth of the same stream (1e4 requests) and compares
the routing cost per decision with the full run's: a ratio near 1 says the router's cost
does not grow with the number of requests. A last row of the first table reads the
snapshots only every 10 ms (``refresh_interval_us=10_000``), to show what the snapshots
cost at every decision.

Run it:  python benchmarks/cluster.py [--requests N] [--replicas C] [--quick]
Times are the processor time of this process (``time.process_time``), not wall time:
on a shared machine they leave out the time other programs take, so the ratios measured
in one process stay meaningful. The simulated times come from the cost model, never
from measured hardware.
"""

from __future__ import annotations

import argparse
import math
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import simsim
from simsim.cluster import ReplicaSnapshot, Router, make_router

#: The cost model of benchmarks/batching.py, so that the two benchmarks compare.
COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=100,
    decode_base_us=8_000,
    decode_per_active_sequence_us=300,
)
SLOTS = 16
RATE_PER_REPLICA_PER_S = 10.0
ROUTERS = (
    "round_robin",
    "random",
    "least_outstanding",
    "power_of_two",
    "least_kv_cache",
    "weighted",
)
STALE_REFRESH_US = 10_000

#: Processor time of this process: a busy machine's other programs do not count.
CLOCK = time.process_time


class _Stopwatch:
    """Wraps a callable and keeps the processor time of every call, in seconds."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.durations: array[float] = array("d")

    def __call__(self, *args: Any) -> Any:
        started = CLOCK()
        result = self.inner(*args)
        self.durations.append(CLOCK() - started)
        return result

    @property
    def seconds(self) -> float:
        return math.fsum(self.durations)

    @property
    def median_us(self) -> float:
        return float(np.median(self.durations)) * 1e6 if self.durations else 0.0


class _TimedRouter:
    """A router whose ``route`` calls are timed by a :class:`_Stopwatch`."""

    def __init__(self, inner: Router) -> None:
        self.watch = _Stopwatch(inner.route)

    def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        choice: int = self.watch(request, replicas)
        return choice


@dataclass(frozen=True)
class Result:
    """One cluster run."""

    router: str
    replicas: int
    requests: int
    refresh_interval_us: int
    replica_events: int
    decisions: int
    refreshes: int
    iterations: int
    tokens: int
    cpu_s: float
    routing_s: float
    routing_median_us: float
    snapshot_s: float
    route_s: float
    mean_queue_delay_us: float
    p99_ttft_us: float

    @property
    def events(self) -> int:
        """Replicas' processed events plus routing decisions."""
        return self.replica_events + self.decisions

    @property
    def events_per_s(self) -> float:
        return self.events / self.cpu_s

    @property
    def routing_us_per_decision(self) -> float:
        """Mean time of one routing step: snapshots if due, route, bookkeeping."""
        return self.routing_s * 1e6 / self.decisions

    @property
    def snapshot_us_per_decision(self) -> float:
        return self.snapshot_s * 1e6 / self.decisions

    @property
    def route_us_per_decision(self) -> float:
        return self.route_s * 1e6 / self.decisions

    @property
    def routing_share(self) -> float:
        """Fraction of the run's time spent routing."""
        return self.routing_s / self.cpu_s

    @property
    def mean_batch(self) -> float:
        """Output tokens per iteration: about the mean number of decoding requests."""
        return self.tokens / self.iterations


def workload(requests: int, replicas: int, seed: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Arrival times (us), prompt and output lengths of a Poisson stream at
    ``RATE_PER_REPLICA_PER_S * replicas`` requests/s; a shorter run is a prefix."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1e6 / (RATE_PER_REPLICA_PER_S * replicas), requests)
    arrivals = np.rint(np.cumsum(gaps)).astype(np.int64)
    lengths = np.random.default_rng(seed + 1)
    prompts = lengths.integers(64, 513, requests)
    outputs = lengths.integers(32, 129, requests)
    return arrivals.tolist(), prompts.tolist(), outputs.tolist()


def fleet(env: simsim.Environment, replicas: int, **options: Any) -> list[simsim.BatchingEngine]:
    """*replicas* batching replicas on *env* (``SLOTS`` slots, the mixed policy, a KV
    cache, :data:`COSTS`); *options* go to every ``BatchingEngine``."""
    backend = simsim.SimulatedBackend(COSTS)
    return [
        simsim.BatchingEngine(
            backend,
            max_active_requests=SLOTS,
            max_batch_tokens=2_048,
            policy="mixed",
            kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=1_024),
            env=env,
            **options,
        )
        for _ in range(replicas)
    ]


def run(
    router_name: str, requests: int, replicas: int, refresh_interval_us: int = 0, seed: int = 0
) -> Result:
    """Serve *requests* requests on *replicas* batching replicas behind *router_name*."""
    arrivals, prompts, outputs = workload(requests, replicas, seed)
    env = simsim.Environment()
    engines = fleet(env, replicas)
    options = {"seed": seed} if router_name in ("random", "power_of_two") else {}
    router = _TimedRouter(make_router(router_name, **options))
    cluster = simsim.Cluster(engines, router, refresh_interval_us=refresh_interval_us)
    # Measurement only: time the cluster's routing step and, within it, its snapshot
    # step, by wrapping both on this instance (private methods: a benchmark's licence).
    routing = _Stopwatch(cluster._route)
    cluster._route = routing  # type: ignore[method-assign]
    snapshots = _Stopwatch(cluster._take_snapshots)
    cluster._take_snapshots = snapshots  # type: ignore[method-assign]
    started = CLOCK()
    for request_id, (arrival, prompt, output) in enumerate(
        zip(arrivals, prompts, outputs, strict=True)
    ):
        cluster.submit(simsim.Request(request_id, arrival, prompt, output))
    cluster.run()
    cpu_s = CLOCK() - started
    frame = cluster.requests_frame()
    if not (frame["state"] == "FINISHED").all():
        raise RuntimeError(f"{router_name}: not every request finished")
    return Result(
        router=router_name,
        replicas=replicas,
        requests=requests,
        refresh_interval_us=refresh_interval_us,
        replica_events=sum(engine.processed_event_count for engine in engines),
        decisions=len(routing.durations),
        refreshes=len(snapshots.durations),
        iterations=sum(len(engine.iterations_frame()) for engine in engines),
        tokens=sum(outputs),
        cpu_s=cpu_s,
        routing_s=routing.seconds,
        routing_median_us=routing.median_us,
        snapshot_s=snapshots.seconds,
        route_s=router.watch.seconds,
        mean_queue_delay_us=float(frame["queue_delay_us"].mean()),
        p99_ttft_us=float(frame["ttft_us"].astype("float64").quantile(0.99)),
    )


def table(results: Sequence[Result]) -> str:
    """The runs as a Markdown table."""
    lines = [
        "| router | refresh us | requests | replica events | decisions | refreshes | CPU s "
        "| events/s | routing us/decision | snapshots us | route us | routing share | mean batch "
        "| mean queue delay ms | p99 TTFT ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.router} | {r.refresh_interval_us:,} | {r.requests:,} | {r.replica_events:,} "
            f"| {r.decisions:,} | {r.refreshes:,} | {r.cpu_s:.2f} | {r.events_per_s:,.0f} "
            f"| {r.routing_us_per_decision:.1f} | {r.snapshot_us_per_decision:.1f} "
            f"| {r.route_us_per_decision:.2f} | {r.routing_share:.1%} | {r.mean_batch:.1f} "
            f"| {r.mean_queue_delay_us / 1e3:.1f} | {r.p99_ttft_us / 1e3:.1f} |"
        )
    return "\n".join(lines)


def scaling_table(pairs: Sequence[tuple[Result, Result]]) -> str:
    """Routing cost per decision on the short run and the full one, and their ratios."""
    small, large = pairs[0]
    lines = [
        f"| router | mean us at {small.requests:,} | mean us at {large.requests:,} | ratio "
        f"| median us at {small.requests:,} | median us at {large.requests:,} | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for small, large in pairs:
        mean_ratio = large.routing_us_per_decision / small.routing_us_per_decision
        median_ratio = large.routing_median_us / small.routing_median_us
        lines.append(
            f"| {large.router} | {small.routing_us_per_decision:.1f} "
            f"| {large.routing_us_per_decision:.1f} | {mean_ratio:.2f} "
            f"| {small.routing_median_us:.1f} | {large.routing_median_us:.1f} "
            f"| {median_ratio:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> tuple[list[Result], list[tuple[Result, Result]]]:
    """Run every router at full size and at a tenth of it, and print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests per run")
    parser.add_argument("--replicas", type=int, default=64, help="replicas in the cluster")
    parser.add_argument(
        "--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS), help="routers to run"
    )
    parser.add_argument("--quick", action="store_true", help="a small run for the smoke test")
    args = parser.parse_args(argv)
    requests, replicas = (2_000, 8) if args.quick else (args.requests, args.replicas)
    small_requests = requests // 10
    results: list[Result] = []
    pairs: list[tuple[Result, Result]] = []
    for name in args.routers:
        small = run(name, small_requests, replicas)
        large = run(name, requests, replicas)
        results.append(large)
        pairs.append((small, large))
    if "least_outstanding" in args.routers:
        results.append(run("least_outstanding", requests, replicas, STALE_REFRESH_US))
    print(
        f"{replicas} BatchingEngine replicas ({SLOTS} slots, mixed policy, KV cache), Poisson "
        f"at {RATE_PER_REPLICA_PER_S * replicas:,.0f} requests/s; events = replicas' processed "
        "events + routing decisions (processor time of this process)"
    )
    print(table(results))
    print(
        "(with refresh 0 a snapshot is taken when the router first reads it: its cost is in "
        "'route us'; 'snapshots us' is then the set-up of the decision's lazy view)"
    )
    print()
    print("Routing cost per decision (snapshots + route) on the first tenth of the stream and")
    print("on all of it: a ratio near 1 means it does not grow with the number of requests")
    print(scaling_table(pairs))
    return results, pairs


if __name__ == "__main__":
    main()
