"""How a sweep's wall time scales with workers: serial, a process pool, a Dask cluster.

One sweep (a grid of arrival rates on the single-slot server, several replications)
runs through each executor in the same process; the script prints wall time, runs per
second and the speedup over the serial run, and checks that every executor gives the
same tables. Runs are independent, so on N cores the speedup can approach N, less the
cost of starting workers and shipping each run's scenario to them.

Run it:  python benchmarks/sweeps.py [--runs-per-point N] [--count N] [--quick]
Wall times are measured on this machine; the simulated times are from the cost model,
never measured hardware performance.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

import simsim


def scenario(count: int) -> dict[str, Any]:
    """The benchmark's base scenario: *count* Poisson requests on one slot."""
    return {
        "backend": {"prefill_base_us": 2_000, "prefill_per_token_us": 50, "decode_base_us": 8_000},
        "workload": {
            "count": count,
            "rate_per_s": 1.0,
            "prompt_tokens": [16, 1024],
            "output_tokens": [0, 128],
        },
    }


RATES = [0.6, 0.9, 1.2, 1.5]


@dataclass(frozen=True)
class Timing:
    """One executor's run of the sweep."""

    executor: str
    runs: int
    wall_s: float

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.wall_s


def _time(name: str, run: Callable[[], simsim.SweepResult]) -> tuple[Timing, simsim.SweepResult]:
    started = time.perf_counter()
    result = run()
    return Timing(name, len(result.runs), time.perf_counter() - started), result


def main(argv: Sequence[str] | None = None) -> list[Timing]:
    """Run the benchmark and print its table; returns the timings (serial first)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-point", type=int, default=6, help="replications")
    parser.add_argument("--count", type=int, default=2_000, help="requests per run")
    parser.add_argument("--quick", action="store_true", help="a few small runs (smoke test)")
    args = parser.parse_args(argv)
    replications, count = (2, 50) if args.quick else (args.runs_per_point, args.count)
    base = scenario(count)
    grid = {"workload.rate_per_s": RATES}
    workers = os.cpu_count() or 1

    def sweep(**options: Any) -> Callable[[], simsim.SweepResult]:
        return lambda: simsim.sweep(base, grid, replications=replications, seed=3, **options)

    timings = []
    serial_timing, serial = _time("serial (workers=1)", sweep(workers=1))
    timings.append(serial_timing)
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        pool.submit(int).result()  # start the pool outside the timed region
        timing, result = _time(f"process pool ({workers} workers)", sweep(executor=pool))
    timings.append(timing)
    pd.testing.assert_frame_equal(result.runs, serial.runs)
    if importlib.util.find_spec("distributed") is not None:
        from distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            timing, result = _time(
                f"Dask LocalCluster ({workers} workers)", sweep(executor=client.get_executor())
            )
        timings.append(timing)
        pd.testing.assert_frame_equal(result.runs, serial.runs)
    print(
        f"Sweep: {len(RATES)} rates x {replications} replications = {serial_timing.runs} runs "
        f"of {count} requests each (single slot); same tables from every executor.\n"
    )
    print("| executor | wall s | runs/s | speedup over serial |")
    print("| --- | ---: | ---: | ---: |")
    for t in timings:
        speedup = serial_timing.wall_s / t.wall_s
        print(f"| {t.executor} | {t.wall_s:.2f} | {t.runs_per_s:.2f} | {speedup:.2f}x |")
    return timings


if __name__ == "__main__":
    main()
