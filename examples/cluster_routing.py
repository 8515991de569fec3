"""Routing a fleet: eight batching replicas with prefix caches, eight routers, one workload.

Requests share one of sixteen long system prompts, more than one replica's KV cache
holds (so a prefix cache helps if the router sends a group to the same replicas), and
arrive as a Poisson stream at a load the fleet can carry. Each built-in router, and one
written here, routes the same requests; the table shows how the latency, the
prefix-cache hit rate and the balance of the load change with the policy. Then the same
eight machines split into four prefill and four decode replicas show what
disaggregation does on this workload: here it loses, because four decode replicas must
carry the decoding that eight shared, and they become the bottleneck (a request's TTFT
includes its wait for decode memory), while what it buys, decode steps no longer
stretched by prefills sharing their iteration, is small at this prompt mix.

Run it:  python examples/cluster_routing.py
"""

from __future__ import annotations

from collections.abc import Sequence

import simsim
from simsim.cluster import Cluster, DisaggregatedCluster, KvTransferConfig, ReplicaSnapshot
from simsim.workloads import OpenLoopWorkload, PoissonArrivals, SharedPrefixes, Uniform

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=40,
    prefill_per_active_sequence_us=0,
    decode_base_us=8_000,
    decode_per_active_sequence_us=150,
)
BLOCK = 16
REPLICAS = 8
RATE = 60
GROUPS = 16
BLOCKS = 1_024
PREFILL = 4
SPLIT = f"{PREFILL} prefill + {REPLICAS - PREFILL} decode"
WORKLOAD = OpenLoopWorkload(
    arrivals=PoissonArrivals(rate_per_s=RATE),
    prompt_tokens=Uniform(32, 256),
    output_tokens=Uniform(16, 96),
    count=1_200,
    shared_prefixes=SharedPrefixes(lengths=[2_048] * GROUPS, block_size_tokens=BLOCK),
)
LINK = KvTransferConfig(
    kv_bytes_per_token=131_072, bandwidth_bytes_per_s=12_500_000_000, base_us=500
)


def replica(env: simsim.Environment) -> simsim.BatchingEngine:
    """One batching server: 32 slots, a KV cache with room for a few shared prompts, a
    prefix cache."""
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=32,
        max_batch_tokens=4_096,
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(BLOCK, BLOCKS),
        prefix_cache=True,
        env=env,
    )


class BoundedPrefixAffinity:
    """A router of our own: the longest cached prefix among the replicas that carry at
    most *slack* requests more than the average; ties to the less loaded, then the
    lower position."""

    def __init__(self, slack: int = 4) -> None:
        self.slack = slack

    def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        hashes = request.block_hashes
        mean = sum(s.outstanding for s in replicas) / len(replicas)
        allowed = [s for s in replicas if s.outstanding <= mean + self.slack]
        best = max(
            allowed, key=lambda s: (s.cached_prefix_blocks(hashes), -s.outstanding, -s.replica)
        )
        return best.replica


def run(cluster: Cluster) -> dict[str, float]:
    """Run the workload through *cluster*; the numbers of one table row."""
    WORKLOAD.generate(seed=5).submit_to(cluster)
    cluster.run()
    frame = cluster.requests_frame()
    summary = simsim.summarize(frame)["value"]
    column = "replica" if "replica" in frame else "decode_replica"
    routed = frame[column].value_counts()
    return {
        "ttft_ms_mean": summary["ttft_us_mean"] / 1_000,
        "ttft_ms_p99": summary["ttft_us_p99"] / 1_000,
        "e2e_ms_p99": summary["e2e_latency_us_p99"] / 1_000,
        "hit_rate": summary["prefix_cache_hit_rate_tokens"],
        "busiest": int(routed.max()),
        "idlest": int(routed.min()),
    }


def show(name: str, row: dict[str, float], note: str = "") -> dict[str, float]:
    """Print one table row; return it."""
    print(
        f"{name:<21}{row['ttft_ms_mean']:>8.1f}ms{row['ttft_ms_p99']:>8.1f}ms"
        f"{row['e2e_ms_p99']:>8.1f}ms{row['hit_rate']:>6.0%}"
        f"  {row['idlest']}-{row['busiest']}{note}"
    )
    return row


def main() -> dict[str, dict[str, float]]:
    """Print one row per router, then the disaggregated fleet; return the rows."""
    routers: dict[str, object] = {
        "round_robin": "round_robin",
        "random": "random",
        "least_outstanding": "least_outstanding",
        "least_kv_cache": "least_kv_cache",
        "power_of_two": "power_of_two",
        "prefix_affinity": "prefix_affinity",
        "weighted": "weighted",
        "bounded_affinity": BoundedPrefixAffinity(),
    }
    rows: dict[str, dict[str, float]] = {}
    print(f"{REPLICAS} batching replicas, {WORKLOAD.count} requests at {RATE}/s,", end=" ")
    print(f"{GROUPS} shared prompts of {WORKLOAD.shared_prefixes.lengths[0]} tokens")  # type: ignore[union-attr]
    print(f"{'router':<21}{'TTFT mean':>10}{'TTFT p99':>10}{'E2E p99':>10}{'hits':>6}  requests")
    for name, router in routers.items():
        env = simsim.Environment()
        cluster = Cluster([replica(env) for _ in range(REPLICAS)], router)  # type: ignore[arg-type]
        rows[name] = show(name, run(cluster))
    env = simsim.Environment()
    split = DisaggregatedCluster(
        [replica(env) for _ in range(PREFILL)],
        [replica(env) for _ in range(REPLICAS - PREFILL)],
        LINK,
        prefill_router="prefix_affinity",
        decode_router="least_outstanding",
    )
    rows[SPLIT] = show(SPLIT, run(split), " per decode replica")
    transfers = split.requests_frame()["transfer_us"] / 1_000
    print(f"KV transfers: mean {transfers.mean():.2f} ms, max {transfers.max():.2f} ms")
    return rows


if __name__ == "__main__":
    main()
