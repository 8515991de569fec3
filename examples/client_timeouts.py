"""Client timeouts: each client gives up on its request after a deadline.

A client submits a request and waits for whichever comes first: the request's
completion or its own deadline (``env.any_of``). If the deadline wins and the request
is still running or queued, the client cancels it; the server frees the slot and the
next request is admitted at the end of that microsecond.

The same-microsecond race: when the deadline and the request's last token fall on the
same microsecond, the deadline's timeout was scheduled when the request was submitted,
before any of the request's work at that time, so SimPy processes it first and the
client cancels: the request ends CANCELLED even though all its tokens were generated.
A request must *finish* strictly before its deadline to count. The client checks
``is_terminal`` before cancelling, because cancelling a finished request is an error.

Run it:  python examples/client_timeouts.py
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


def impatient_client(
    env: simsim.Environment,
    engine: simsim.SimulationEngine,
    request: simsim.Request,
    patience_us: int,
) -> Generator[simpy.Event, object, None]:
    """Submit *request* now and cancel it if it has not finished within *patience_us*."""
    engine.submit(request)
    done = engine.completion(request.request_id)
    yield env.any_of([done, env.timeout(patience_us)])
    if not request.is_terminal:
        engine.cancel_request(request.request_id)


def arrivals(
    env: simsim.Environment,
    engine: simsim.SimulationEngine,
    rng: random.Random,
    count: int,
    mean_patience_us: int,
) -> Generator[simpy.Event, object, None]:
    """Start one impatient client every ~80 ms (exponential gaps)."""
    for request_id in range(count):
        yield env.timeout(round(rng.expovariate(1 / 80_000)))
        request = simsim.Request(
            request_id,
            arrival_time_us=env.now,
            prompt_token_count=rng.randint(16, 512),
            max_output_tokens=rng.randint(1, 32),
        )
        # Patience varies from client to client (exponential around the mean).
        patience = 1 + round(rng.expovariate(1 / mean_patience_us))
        env.process(impatient_client(env, engine, request, patience))


def run(mean_patience_us: int, count: int = 300, seed: int = 3) -> dict[str, int]:
    """Run one scenario and count how requests ended."""
    env = simsim.Environment()
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env)
    env.process(arrivals(env, engine, random.Random(seed), count, mean_patience_us))
    env.run()
    frame = engine.requests_frame()
    cancelled = frame[frame["state"] == "CANCELLED"]
    return {
        "finished": int((frame["state"] == "FINISHED").sum()),
        "cancelled": len(cancelled),
        "cancelled_while_queued": int(cancelled["admit_time_us"].isna().sum()),
        "cancelled_while_running": int(cancelled["admit_time_us"].notna().sum()),
        "wasted_tokens": int(cancelled["generated_token_count"].sum()),
    }


def main() -> dict[int, dict[str, int]]:
    """Compare three mean patience levels and print how requests ended."""
    print("mean patience  finished  cancelled (queued / running)  tokens wasted")
    results = {}
    for patience_ms in (50, 150, 1000):
        counts = run(patience_ms * 1000)
        results[patience_ms] = counts
        print(
            f"{patience_ms:>10} ms  {counts['finished']:>8}  {counts['cancelled']:>9} "
            f"({counts['cancelled_while_queued']:>3} / {counts['cancelled_while_running']:>3})"
            f"{counts['wasted_tokens']:>19}"
        )
    return results


if __name__ == "__main__":
    main()
