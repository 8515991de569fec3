"""Closed-loop clients: N users who each wait for their answer, think, and ask again.

Each user is a SimPy process: submit a request, ``yield engine.completion(rid)``, think
for a while, repeat. With few users the server idles between requests; add users and
throughput rises until the single slot saturates, after which only latency grows.

Run it:  python examples/closed_loop.py
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Generator, Iterator

import simpy

import simsim

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=0,
)
THINK_TIME_US = 500_000
HORIZON_US = 60_000_000  # one simulated minute


def user(
    env: simsim.Environment,
    engine: simsim.SimulationEngine,
    ids: Iterator[int],
    rng: random.Random,
) -> Generator[simpy.Event, object, None]:
    """Ask, wait for the answer, think, and ask again until the horizon."""
    while env.now < HORIZON_US:
        request = engine.submit(
            simsim.Request(
                next(ids),
                arrival_time_us=env.now,
                prompt_token_count=rng.randint(32, 256),
                max_output_tokens=rng.randint(4, 24),
            )
        )
        yield engine.completion(request.request_id)
        yield env.timeout(round(rng.expovariate(1 / THINK_TIME_US)))


def run(users: int, seed: int = 1) -> tuple[float, float]:
    """Return (finished requests per simulated second, mean e2e latency in ms)."""
    env = simsim.Environment()
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env)
    ids = itertools.count()
    rng = random.Random(seed)
    for _ in range(users):
        env.process(user(env, engine, ids, rng))
    env.run()
    summary = simsim.summarize(engine.requests_frame())["value"]
    return summary["throughput_requests_per_s"], summary["e2e_latency_us_mean"] / 1000


def main() -> dict[int, tuple[float, float]]:
    """Sweep the number of users and print throughput and latency for each."""
    print("users  requests/s  mean e2e (ms)")
    results = {}
    for users in (1, 2, 4, 8, 16):
        throughput, latency_ms = run(users)
        results[users] = (throughput, latency_ms)
        print(f"{users:>5}  {throughput:>10.2f}  {latency_ms:>13.1f}")
    return results


if __name__ == "__main__":
    main()
