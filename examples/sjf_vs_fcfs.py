"""Shortest job first against first come, first served, on one busy slot.

Nine requests in ten are short chat answers; one in ten asks for a long report. At 90%
load the single slot keeps a queue, and the order it serves that queue in decides who
waits. ``ShortestJobFirstScheduler`` orders by the output limit (``max_output_tokens``,
known at arrival): chat requests jump ahead of reports, so the mean latency falls, but a
report can wait behind a long run of chats, so the reports' tail grows (the p99 about
four times FCFS's). Aging forgives a waiting request 20 tokens per second: only requests
arriving within 128 / 20 = 6.4 s after a report can overtake it, which bounds the
reports' tail again while keeping most of the gain in the mean.

Every policy serves the same requests (same seed). Times are simulated from the cost
model, not measured. ``benchmarks/schedulers.py`` checks the same policies against
queueing theory.

Run it:  python examples/sjf_vs_fcfs.py
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

import simsim
from simsim.schedulers import ShortestJobFirstScheduler

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=0,
)
#: (class, share of requests, output tokens low..high); every prompt is 16..512 tokens.
CLASSES = (("chat", 0.9, (1, 16)), ("report", 0.1, (64, 128)))
LOAD = 0.9
AGING_TOKENS_PER_S = 20.0

POLICIES: dict[str, Callable[[], simsim.Scheduler]] = {
    "fcfs": simsim.FcfsScheduler,
    "shortest job first": ShortestJobFirstScheduler,
    f"sjf, aging {AGING_TOKENS_PER_S:g} tokens/s": lambda: ShortestJobFirstScheduler(
        aging_per_s=AGING_TOKENS_PER_S
    ),
}


def make_requests(count: int, seed: int) -> list[simsim.Request]:
    """*count* requests: Poisson arrivals at LOAD, each a chat or a report."""
    rng = np.random.default_rng(seed)
    names = [name for name, _, _ in CLASSES]
    kinds = rng.choice(len(CLASSES), size=count, p=[share for _, share, _ in CLASSES])
    prompts = rng.integers(16, 513, size=count)
    outputs = [int(rng.integers(CLASSES[k][2][0], CLASSES[k][2][1] + 1)) for k in kinds]
    # Mean service time of the mix, to set the arrival rate for the load.
    mean_service_us = float(
        np.mean(
            [
                COSTS.prefill_base_us + COSTS.prefill_per_token_us * p + COSTS.decode_base_us * o
                for p, o in zip(prompts, outputs, strict=True)
            ]
        )
    )
    gaps = rng.exponential(mean_service_us / LOAD, size=count)
    arrivals = np.rint(np.cumsum(gaps)).astype(int)
    return [
        simsim.Request(
            i, int(arrivals[i]), int(prompts[i]), outputs[i], request_class=names[kinds[i]]
        )
        for i in range(count)
    ]


def run(policy: Callable[[], simsim.Scheduler], requests: list[simsim.Request]) -> pd.DataFrame:
    """Serve fresh copies of *requests* on one slot with *policy*; the request table."""
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), policy())
    for r in requests:
        engine.submit(
            simsim.Request(
                r.request_id,
                r.arrival_time_us,
                r.prompt_token_count,
                r.max_output_tokens,
                request_class=r.request_class,
            )
        )
    engine.run()
    return engine.requests_frame()


def main(count: int = 2_000, seed: int = 17) -> pd.DataFrame:
    """Run every policy, print one row each, and return the table (milliseconds)."""
    requests = make_requests(count, seed)
    rows = []
    for name, policy in POLICIES.items():
        frame = run(policy, requests)
        latency_ms = frame["e2e_latency_us"] / 1_000
        by_class = latency_ms.groupby(frame["request_class"])
        rows.append(
            {
                "policy": name,
                "mean": latency_ms.mean(),
                "p99": latency_ms.quantile(0.99),
                "chat mean": by_class.mean()["chat"],
                "chat p99": by_class.quantile(0.99)["chat"],
                "report mean": by_class.mean()["report"],
                "report p99": by_class.quantile(0.99)["report"],
                "report max": by_class.max()["report"],
            }
        )
    table = pd.DataFrame(rows).set_index("policy")
    reports = sum(r.request_class == "report" for r in requests)
    print(f"{count} requests ({reports} reports) at load {LOAD}, one slot, seed {seed}")
    print("end-to-end latency, simulated ms:")
    print(table.round(0).astype(int).to_string())
    return table


if __name__ == "__main__":
    main()
