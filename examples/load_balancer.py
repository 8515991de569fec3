"""A foreign SimPy model around the servers: a load balancer, and a monitor that never stops.

Two single-slot servers share one environment. A balancer process receives every
request and routes it to the server with the fewest outstanding requests (join the
shortest queue), breaking ties by server index. A monitor process samples both
servers every 100 ms for ever, so the heap is never empty: the model is driven with
``env.run(until=...)`` rather than ``engine.run()``.

Run it:  python examples/load_balancer.py
"""

from __future__ import annotations

import random
from collections.abc import Generator

import simpy

import simsim

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=0,
)
HORIZON_US = 30_000_000  # thirty simulated seconds


def outstanding(engine: simsim.SimulationEngine) -> int:
    """Requests submitted to *engine* that are not finished or cancelled yet."""
    return sum(not r.is_terminal for r in engine.requests.values())


def balancer(
    env: simsim.Environment,
    servers: list[simsim.SimulationEngine],
    rng: random.Random,
) -> Generator[simpy.Event, object, None]:
    """Route a Poisson stream of requests to the least-loaded server."""
    request_id = 0
    while True:
        yield env.timeout(round(rng.expovariate(1 / 60_000)))
        target = min(range(len(servers)), key=lambda i: (outstanding(servers[i]), i))
        servers[target].submit(
            simsim.Request(
                request_id,
                arrival_time_us=env.now,
                prompt_token_count=rng.randint(16, 512),
                max_output_tokens=rng.randint(1, 32),
            )
        )
        request_id += 1


def monitor(
    env: simsim.Environment,
    servers: list[simsim.SimulationEngine],
    samples: list[tuple[int, ...]],
) -> Generator[simpy.Event, object, None]:
    """Record every server's outstanding count every 100 ms, for ever."""
    while True:
        samples.append(tuple(outstanding(server) for server in servers))
        yield env.timeout(100_000)


def main(seed: int = 11) -> dict[str, object]:
    """Run thirty simulated seconds and print how the two servers shared the load."""
    env = simsim.Environment()
    servers = [simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env) for _ in range(2)]
    samples: list[tuple[int, ...]] = []
    env.process(balancer(env, servers, random.Random(seed)))
    env.process(monitor(env, servers, samples))
    env.run(until=HORIZON_US)

    print(f"load balancer over 2 servers, {HORIZON_US // 1_000_000} simulated seconds")
    result: dict[str, object] = {"samples": len(samples)}
    for index, server in enumerate(servers):
        summary = simsim.summarize(server.requests_frame())["value"]
        result[f"server{index}"] = summary
        print(
            f"server {index}: {summary['count_FINISHED']:.0f} finished, "
            f"mean e2e {summary['e2e_latency_us_mean'] / 1000:.1f} ms, "
            f"p99 e2e {summary['e2e_latency_us_p99'] / 1000:.1f} ms"
        )
    peak = max(max(sample) for sample in samples)
    print(f"monitor: {len(samples)} samples, peak outstanding on one server {peak}")
    print(f"heap still busy after the horizon: {servers[0].has_pending_events}")
    return result


if __name__ == "__main__":
    main()
