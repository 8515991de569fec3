"""How many GPUs? The cheapest vLLM deployment that meets latency targets, before it exists.

Llama-3.1-8B-Instruct serving 20 requests/s of 1,000-token prompts and 200-token answers,
within 1 s p99 time to first token and 50 ms p99 between tokens: simsim tries H100s and
80 GB A100s at tensor parallelism 1, finds the fewest replicas of each that meet the
targets (vLLM-shaped servers behind a least-outstanding router, priced by the physics
cost model fitted on real vLLM runs), and names the cheapest per GPU-hour.

Run it:   python examples/how_many_gpus.py
"""

from __future__ import annotations

from simsim.gpu import plan_capacity
from simsim.workloads import Fixed, OpenLoopWorkload, PoissonArrivals

RATE_PER_S = 20
DURATION_S = 30


def main() -> None:
    workload = OpenLoopWorkload(
        arrivals=PoissonArrivals(RATE_PER_S),
        prompt_tokens=Fixed(1000),
        output_tokens=Fixed(200),
        count=RATE_PER_S * DURATION_S,
    )
    plan = plan_capacity(
        "meta-llama/Llama-3.1-8B-Instruct",
        workload,
        targets={"ttft_p99_ms": 1000, "itl_p99_ms": 50},
        gpus=["H100", "A100-80GB"],
        tp=[1],
        max_replicas=4,
        workers=1,
    )
    columns = ["gpu", "tp", "replicas", "gpus", "usd_per_hour", "ttft_p99_ms", "itl_p99_ms"]
    table = plan.table[[*columns, "verdict"]]
    print(f"{RATE_PER_S} requests/s for {DURATION_S} s; targets: p99 TTFT 1 s, p99 ITL 50 ms")
    print(table.to_string(index=False, float_format=lambda value: f"{value:,.1f}"))
    best = plan.best
    if best is None:
        print("no configuration met the targets")
    else:
        print(
            f"cheapest: {best.replicas} x {best.gpu} at tp={best.tp} "
            f"({best.gpus} GPUs), ${best.usd_per_hour:,.2f} per hour"
        )


if __name__ == "__main__":
    main()
