"""How much load can one configuration take within its latency targets?

A capacity search answers it: bisection over the arrival rate, with every probed rate
run several times with its own seeds. Then a small sweep around the answer shows what
happens on either side. Runs go to a local process pool; pass
``executor=distributed.Client(...).get_executor()`` to run them on a Dask cluster.

Every number here is simulated from the cost model, not measured on hardware.
"""

from __future__ import annotations

from typing import Any

import simsim

# A continuous-batching server with 16 slots and a cost model in microseconds.
SCENARIO: dict[str, Any] = {
    "scenario": {"engine": "batching"},
    "backend": {
        "prefill_base_us": 2_000,
        "prefill_per_token_us": 50,
        "prefill_per_active_sequence_us": 100,
        "decode_base_us": 8_000,
        "decode_per_active_sequence_us": 300,
    },
    "batching": {"max_active_requests": 16, "max_batch_tokens": 512, "policy": "mixed"},
    "workload": {
        "count": 1_000,
        "rate_per_s": 1.0,  # the search replaces this
        "prompt_tokens": [16, 1024],
        "output_tokens": [1, 128],
    },
}
TARGETS = {"ttft_us_p99": 1_000_000, "tpot_us_p90": 40_000}


def main(workers: int | None = None) -> simsim.CapacityResult:
    """Run the search and the sweep, print what they found, return the search."""
    found = simsim.capacity_search(
        SCENARIO,
        "workload.rate_per_s",
        low=0.5,
        high=16.0,
        tolerance=0.25,
        targets=TARGETS,
        replications=6,
        seed=11,
        workers=workers,
    )
    low, high = found.interval
    print("Targets: p99 TTFT <= 1000 ms and p90 TPOT <= 40 ms (simulated)")
    print(f"Capacity: {found.value:.3f} requests/s ({found.status})")
    print(f"The targets are met at {low:.3f} and not met at {high:.3f} requests/s")
    print(f"Probed {len(found.evaluations)} rates with {len(found.runs)} runs:")
    print("    rate  runs  p99 TTFT (ms)  p90 TPOT (ms)  verdict")
    for row in found.evaluations.itertuples():
        print(
            f"  {row.value:6.3f}  {row.replications:4d}  {row.ttft_us_p99_mean / 1e3:13.1f}  "
            f"{row.tpot_us_p90_mean / 1e3:13.1f}  {row.verdict}"
        )

    assert found.value is not None
    rates = [found.value * f for f in (0.5, 0.75, 1.0, 1.25)]
    result = simsim.sweep(
        SCENARIO, {"workload.rate_per_s": rates}, replications=6, seed=11, workers=workers
    )
    table = result.summary[result.summary["metric"] == "ttft_us_p99"]
    print("\nSweep around it: p99 TTFT (ms), mean and 95% interval over 6 runs")
    for row in table.itertuples():
        print(
            f"  {row[2]:7.3f} req/s: {row.mean / 1e3:8.1f}  "
            f"[{row.ci_low / 1e3:8.1f}, {row.ci_high / 1e3:8.1f}]"
        )
    return found


if __name__ == "__main__":
    main()
