"""Open-loop clients: requests arrive on their own schedule, whatever the server does.

A SimPy process draws exponential gaps between arrivals (a Poisson process) and submits
each request at the moment it arrives. The server's speed never slows the arrivals
down, so queueing delay grows as the load approaches the server's capacity.

Run it:  python examples/open_loop.py
"""

from __future__ import annotations

import random
from collections.abc import Generator

import pandas as pd
import simpy

import simsim

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=0,
)


def poisson_client(
    env: simsim.Environment,
    engine: simsim.SimulationEngine,
    rng: random.Random,
    count: int,
    mean_gap_us: int,
) -> Generator[simpy.Event, object, None]:
    """Submit *count* requests with exponential gaps of mean *mean_gap_us*."""
    for request_id in range(count):
        # SimPy time is integer microseconds here: round the random gap.
        yield env.timeout(round(rng.expovariate(1 / mean_gap_us)))
        engine.submit(
            simsim.Request(
                request_id,
                arrival_time_us=env.now,
                prompt_token_count=rng.randint(16, 512),
                max_output_tokens=rng.randint(1, 32),
            )
        )


def main(seed: int = 7, count: int = 200, mean_gap_us: int = 120_000) -> pd.DataFrame:
    """Run the scenario, print a short report, and return the summary table."""
    env = simsim.Environment()
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env)
    env.process(poisson_client(env, engine, random.Random(seed), count, mean_gap_us))
    env.run()

    requests = engine.requests_frame()
    summary = simsim.summarize(requests)["value"]
    busy_us = (requests["finish_time_us"] - requests["admit_time_us"]).sum()
    print(f"open loop: {count} requests, mean gap {mean_gap_us / 1000:.0f} ms (seed {seed})")
    print(f"finished:        {summary['count_FINISHED']:.0f}")
    print(f"slot busy:       {busy_us / summary['makespan_us']:.1%}")
    print(f"mean queue wait: {summary['queue_delay_us_mean'] / 1000:.1f} ms")
    print(f"p90 TTFT:        {summary['ttft_us_p90'] / 1000:.1f} ms")
    print(f"p99 e2e latency: {summary['e2e_latency_us_p99'] / 1000:.1f} ms")
    return summary.to_frame()


if __name__ == "__main__":
    main()
